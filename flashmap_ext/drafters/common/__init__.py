"""What every drafter shares: the BlockDrafter protocol (base.py), Qwen3-style layers (layers.py), the
draft vocabulary (vocab.py), the K/V cache (kv_cache.py), checkpoint I/O (checkpoint.py)."""

"""Held-out, hardware-independent drafter evaluation (issue 13, item 2): teacher-forced per-slot top-1
accuracy and the expected γ it implies (`heldout`), reported as JSON, Markdown and a plot (`report`)."""

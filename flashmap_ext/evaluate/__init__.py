"""Held-out, hardware-independent drafter evaluation: teacher-forced per-slot top-1
accuracy and the expected γ it implies (`heldout`), reported as JSON, Markdown and a plot (`report`)."""

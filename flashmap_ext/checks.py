"""Argument checks shared by the public API (DESIGN.md §12): one TypeError / ValueError naming the
argument and the accepted range, raised before any model work."""
from __future__ import annotations

import math
import numbers
import os


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high) (high None: no upper bound); TypeError for a non-integer (bool
    included), ValueError outside the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value >= high):
        span = f"[{low}, {bound_text(high)})" if high is not None else f">= {low}"
        must = f"must be {'in ' if high is not None else ''}{span}"
        if name.startswith("--"):  # a command-line option: the CLI's "--flag: ... (got V)"
            raise ValueError(f"{name}: {must} (got {value})")
        raise ValueError(f"{name} {must}, got {value}")
    return value


def check_real(name: str, value, low: float, high: float) -> float:
    """`value` as a float in [low, high]; TypeError for a non-number (bool included), ValueError for NaN
    or outside the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def bound_text(n: int) -> str:
    """2**k for powers of two above 1024, else the number."""
    return f"2**{n.bit_length() - 1}" if n > 1024 and n & (n - 1) == 0 else str(n)


def check_input_path(flag: str, path: str) -> None:
    """FileNotFoundError naming the option when `path` (a file or folder to read) does not exist."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{flag} {path}: no such file or folder")


def check_output_path(flag: str, path: str, folder: bool) -> None:
    """ValueError naming the option when `path` cannot be written as a folder (folder=True) or a file:
    the other kind is there, or a file stands where one of its parent folders should be."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        raise ValueError(f"{flag} {path}: a {'file' if folder else 'folder'} is there "
                         f"(expected {'a folder' if folder else 'a file'})")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder")


def with_article(word: str) -> str:
    """`word` after its indefinite article: 'an Eagle3Drafter' before a vowel, else 'a LookupDrafter'."""
    return f"{'an' if word[:1].upper() in tuple('AEIOU') else 'a'} {word}"


class OneSequenceOnly(ValueError):
    """A drafter that drafts one sequence at a time (prompt lookup, auto, draft trees) was asked for a memory of
    `rows` rows; `generate` given several prompts says so of its `input_ids`."""

    def __init__(self, drafter_name: str, rows: int):
        self.drafter_name, self.rows = drafter_name, rows
        super().__init__(f"batch_size: {with_article(drafter_name)} drafts one sequence at a time, got {rows} "
                         f"(generate: pass one prompt)")


def describe(value) -> str:
    """What an argument is, for an error message: 'a tensor of shape [2, 1] and dtype torch.int64' for a
    tensor (anything with shape and dtype), else its type and repr ('int 5', cut at 40 characters)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r:.40}"

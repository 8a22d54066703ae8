"""The drafter context window (DESIGN.md §5.6): a drafter attends to at most the last W memory entries.

Memory entries are the target's features at committed positions 0..n−1 (the anchor's own entry, where a
drafter has one, is always visible). With a window W, a block whose anchor sits at position p sees the
entries at positions max(0, p − W) .. p − 1, in training (`visible_context`) and at inference
(`window_start`) alike. Keys keep the RoPE rotation of their absolute position: attention scores depend
only on query − key distances, so this equals the computation on the window rebased to positions
0..W−1 (python_tests/drafters/test_context_window.py checks it against a float64 rebased reference), and
every distance the drafter sees stays below W + block size, as in training on sequences of length ≤ W.
"""
from __future__ import annotations

import torch


def check_window(window: int | None, name: str = "context_window") -> int | None:
    """`window` as an int >= 1, or None (unlimited); ValueError naming `name` otherwise."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{name}: expected an integer >= 1 or None (unlimited), got {window!r}")
    return window


def check_window_export(src: object, config: object, unwindowed: bool, flag: str = "unwindowed=True") -> None:
    """NotImplementedError for a checkpoint `src` whose config has a context window unless `unwindowed`: the
    rule of every writer of an engine's format (`flashmap convert`, whose option is `flag`, and the vLLM
    exporters), which leave the window out when `unwindowed`. vLLM's DFlash models, z-lab's code, SGLang and
    our vLLM plugin's paged memory attend to every committed position, so their drafts past the window differ
    from ours (still lossless: the target verifies every draft)."""
    window = getattr(config, "context_window", None)
    if window is not None and not unwindowed:
        raise NotImplementedError(f"{src}: context_window={window} is not served by vLLM (engines attend to the "
                                  "whole context, so their drafts past the window differ from ours; lossless "
                                  f"either way); pass {flag} to write it without")


def window_start(length: int, window: int | None) -> int:
    """Index of the first memory entry a draft sees when `length` entries are committed."""
    return 0 if window is None else max(0, length - window)


def visible_context(anchor_pos: torch.Tensor, length: int, window: int | None) -> torch.Tensor:
    """bool [B, A, T]: block a of row b may read context position j (j < anchor, and j >= anchor − W
    with a window). anchor_pos [B, A] int64 (a padded block's −1 sees nothing)."""
    j = torch.arange(length, device=anchor_pos.device)[None, None, :]
    anchor = anchor_pos[:, :, None]
    visible = j < anchor
    return visible if window is None else visible & (j >= anchor - window)

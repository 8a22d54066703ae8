"""Argument checks of `draft_block` (DESIGN.md §3.2), before any model work: one ValueError / TypeError
naming the argument and what it accepts. Values are read on the host only for CPU tensors (no sync on
CUDA, nothing read while torch.compile traces)."""
from __future__ import annotations

import torch

from flashmap_ext.checks import check_int, describe
from flashmap_ext.drafters.common import base
from flashmap_ext.drafters.common.base import check_memory_type, check_token_ids

_INT63 = 2**63


def _check_not_meta(name: str, t) -> None:
    if isinstance(t, torch.Tensor) and t.is_meta:
        raise ValueError(f"{name}: a meta tensor (no values): pass a cpu or cuda tensor")


def check_memory(drafter, memory) -> None:
    """memory: the FlashMapMemory of `drafter.new_memory(B)`, holding at least one committed position."""
    check_memory_type(drafter, memory)
    _check_not_meta("memory", memory.k)
    if memory.length < 1:
        raise ValueError("memory: empty (length 0): extend_memory with the committed context (at least the "
                         "prompt) before drafting")


def check_key(name: str, value, batch_size: int, expected: str) -> None:
    """seed or position: an int in [0, 2**63), or a [B] / [1] integer tensor of such (CPU values read)."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        _check_not_meta(name, value)
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool \
                or value.numel() not in (1, batch_size) or value.dim() > 1:
            raise ValueError(f"{name}: expected an int or a [B={batch_size}] (or [1]) integer tensor, got "
                             f"{list(value.shape)} {value.dtype}")
        if not base.host_readable(value):
            return
        values = value.reshape(-1).tolist()
    else:
        values = [check_int(name, value, 0, _INT63)]
    bad = [v for v in values if not 0 <= v < _INT63]
    if bad:
        raise ValueError(f"{name}: expected {expected} in [0, 2**63), got {bad[:4]}")


def check_noise(noise, shape: tuple[int, int, int]) -> None:
    """noise: a floating [B, K, d_target] tensor without NaN/inf (CPU values read)."""
    if noise is None:
        return
    if not isinstance(noise, torch.Tensor):
        raise TypeError(f"noise: expected a [B, K, d_target] float tensor, got {type(noise).__name__}")
    _check_not_meta("noise", noise)
    if not noise.is_floating_point():
        raise TypeError(f"noise: expected a floating tensor (fp32, or fp64 for a reference), got {noise.dtype}")
    if tuple(noise.shape) != shape:
        raise ValueError(f"noise: expected {list(shape)}, got {list(noise.shape)}")
    if base.host_readable(noise) and not bool(torch.isfinite(noise).all()):
        raise ValueError("noise: holds NaN or inf entries (the draft would be garbage)")


def check_draft_args(drafter, memory, anchor_tokens, steps, noise, seed, position) -> int:
    """All `draft_block` arguments; returns `steps` resolved (default `config.draft_steps`)."""
    c = drafter.config
    steps = c.draft_steps if steps is None else steps
    if isinstance(steps, bool) or steps not in (1, 2):
        raise ValueError(f"steps: must be 1 or 2, got {steps!r}")
    _check_not_meta("anchor_tokens", anchor_tokens)
    check_memory(drafter, memory)
    if (not isinstance(anchor_tokens, torch.Tensor) or anchor_tokens.dim() != 1
            or anchor_tokens.dtype != torch.int64 or anchor_tokens.shape[0] != memory.batch_size):
        raise ValueError(f"anchor_tokens: expected a [B={memory.batch_size}] int64 tensor (each row's last "
                         f"committed token id), got {describe(anchor_tokens)}")
    check_token_ids("anchor_tokens", anchor_tokens, c.vocab_size)
    B = memory.batch_size
    check_key("seed", seed, B, "a Philox key")
    check_key("position", position, B, "the anchor's absolute position")
    check_noise(noise, (B, c.block_size, c.d_target))
    return steps

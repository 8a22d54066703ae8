"""Fused forms of the DiT drafter ops (torch.ops.flashmap.dit_norm_linear / dit_linear_kv_append), used by the
fused draft step when FLASHMAP_DIT_FUSED_NORMS=1 (DESIGN.md §10).

- `norm_linear`: the adaLN LayerNorm + modulate in the linear's prologue (each CUDA CTA computes the row
  statistics of its rows itself), the per-head QK-RMSNorm and RoPE in its epilogue (one 128-column tile holds
  whole heads). Replaces `linear(adaln(x))` and the `rms_norm` calls after qkv / q.
- `linear_kv_append_`: the memory K/V projection of every layer with the key RMSNorm, RoPE and the cache
  append in its epilogue. Replaces `_write_entries`' linear, rms_norm and kv_append calls.

Both keep every rounding point of the unfused chain (the modulated row and y are rounded to the operand dtype
before the next stage reads them), so on CUDA they equal the unfused kernels bit for bit and on CPU the
unfused CPU ops. References: `dit_reference.norm_linear` / `linear_kv_append` (the unfused references chained).
"""
from __future__ import annotations

from typing import Optional

import torch

from flashmap_ext.ops.dit import _rows

_norm_linear_op = torch.ops.flashmap.dit_norm_linear.default
_linear_kv_append_op = torch.ops.flashmap.dit_linear_kv_append.default


@torch.library.register_fake("flashmap::dit_norm_linear")
def _norm_linear_fake(x, weight, bias=None, activation="none", shift=None, scale=None, adaln_eps=1e-6,
                      q_norm=None, k_norm=None, heads=0, positions=None, theta=10000.0, eps=1e-6):
    torch._check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1])
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.register_fake("flashmap::dit_linear_kv_append")
def _linear_kv_append_fake(k_cache, v_cache, x, weight, bias, k_norm, start, count, theta=10000.0, eps=1e-6):
    torch._check(k_cache.dim() == 5 and x.dim() == 3)


def norm_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                activation: str = "none", shift: Optional[torch.Tensor] = None,
                scale: Optional[torch.Tensor] = None, adaln_eps: float = 1e-6,
                q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None, heads: int = 0,
                positions: Optional[torch.Tensor] = None, theta: float = 10000.0,
                eps: float = 1e-6) -> torch.Tensor:
    """`act(adaln(x, shift, scale) @ weightᵀ + bias)`, then QK-norm (and RoPE) of its leading heads.

    Args:
        x: (..., K). On CUDA K must be a positive multiple of 64.
        weight: (N, K); bias: (N,) or None; activation: "none", "gelu_tanh" or "silu".
        shift, scale: (..., K) flattening to G rows (adaLN, as `ops.dit.adaln`), or both None (no prologue).
        q_norm: (D,) RMSNorm weight of the `heads` query heads in columns [0, heads·D), or None.
        k_norm: (D,) of the next `heads` key heads (columns [heads·D, 2·heads·D)), or None; the rest is left
            as the linear gives it (e.g. the values of a fused qkv). On CUDA D divides 128.
        positions: int64, x's row dims: RoPE at these positions on the normed heads, or None.
        theta, eps: RoPE base and RMSNorm epsilon.
    Returns:
        (..., N) in x's dtype.
    """
    pos = None if positions is None else positions.reshape(-1)
    out = _norm_linear_op(_rows(x), weight, bias, activation, _rows(shift), _rows(scale), adaln_eps, q_norm,
                          k_norm, heads, pos, theta, eps)
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_kv_append_(k_cache: torch.Tensor, v_cache: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor], k_norm: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
                      *, theta: float = 10000.0, eps: float = 1e-6) -> None:
    """In place: every layer's keys (RMS-normed with k_norm[layer], rotated at start[b] + t) and values of the
    entries x, appended at cache row start[b] + t for t < count[b] (rows outside [0, L) dropped).

    Args:
        k_cache, v_cache: (n_layers, B, L, H, D), mutated (e.g. `memory.k.transpose(2, 3)`).
        x: (B, T, K) memory entries. weight: (n_layers·2·H·D, K), per layer the key heads then the value
            heads; bias: (n_layers·2·H·D,) or None. k_norm: (n_layers, D).
        start, count: (B,) int32 on the cache's device (device values: no host sync).
    """
    _linear_kv_append_op(k_cache, v_cache, x, weight, bias, k_norm, start, count, theta, eps)

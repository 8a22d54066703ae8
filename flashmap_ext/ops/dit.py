"""Typed wrappers over the FlashMap DiT drafter ops (torch.ops.flashmap.dit_*) and their fake kernels.

The ops are the building blocks of the fused draft step (DESIGN.md §5, §10; composed in
`flashmap_ext.drafters.flashmap.fused`). CUDA kernels take bf16 (fp32 accumulation and statistics, one
rounding per output); the CPU kernels accept any float dtype and compute in fp32 (fp64 for fp64).
References: `flashmap_ext.ops.dit_reference`. Output shapes never depend on data, so every op is CUDA-graph
and torch.compile safe. Wrappers flatten leading dims: `x [..., K]` means any number of row dims.

Dimension letters: M rows (B·K slots), N output features, K input features, G conditioning rows
(one per batch row; M % G == 0), B batch, Sq queries, Skv keys, H heads, D head dim, V vocabulary,
L cache rows, T new rows.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

_ops = torch.ops.flashmap
_adaln_op = _ops.dit_adaln.default
_linear_op = _ops.dit_linear.default
_rms_norm_op = _ops.dit_rms_norm.default
_attention_op = _ops.dit_attention.default
_kv_append_op = _ops.dit_kv_append.default
_lm_head_op = _ops.dit_lm_head.default

ACTIVATIONS = ("none", "gelu_tanh", "silu")


# ---------------------------------------------------------------- fake (meta) kernels
@torch.library.register_fake("flashmap::dit_adaln")
def _adaln_fake(x, shift, scale, eps=1e-6):
    torch._check(x.dim() == 2 and shift.dim() == 2 and shift.shape == scale.shape)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("flashmap::dit_linear")
def _linear_fake(x, weight, bias=None, activation="none", gate=None, residual=None):
    torch._check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1])
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.register_fake("flashmap::dit_rms_norm")
def _rms_norm_fake(x, weight, positions=None, theta=10000.0, eps=1e-6):
    torch._check(x.dim() == 3 and weight.dim() == 1)
    return x.new_empty(x.shape)


@torch.library.register_fake("flashmap::dit_attention")
def _attention_fake(q, k, v, kv_len=None, scale=0.0):
    torch._check(q.dim() == 4 and k.dim() == 4 and k.shape == v.shape)
    return q.new_empty(q.shape)


@torch.library.register_fake("flashmap::dit_kv_append")
def _kv_append_fake(cache, values, start, count):
    torch._check(cache.dim() == 4 and values.dim() == 4)


def _logits_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.register_fake("flashmap::dit_lm_head")
def _lm_head_fake(x, weight, bias=None, valid_vocab=0, return_logits=False, softcap=0.0):
    torch._check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1])
    shape = (x.shape[0], weight.shape[0]) if return_logits else (0,)
    return x.new_empty((x.shape[0],), dtype=torch.int64), x.new_empty(shape, dtype=_logits_dtype(x))


# ---------------------------------------------------------------- wrappers
def _rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """(..., N) -> (rows, N); explicit row count, so N = 0 works too (reshape(-1, 0) is ambiguous)."""
    return None if t is None else t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def adaln(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """adaLN modulate fused into LayerNorm: `LN(x)·(1 + scale) + shift`, LN without affine (DESIGN.md §5.2).

    Args:
        x: (..., N) — the residual stream, e.g. (B, K, w).
        shift, scale: (..., N) with the leading dims flattening to G rows; row g serves rows
            [g·M/G, (g+1)·M/G) of x, e.g. (B, w) for one conditioning vector per batch row.
        eps: LayerNorm epsilon.
    Returns:
        (..., N) in x's dtype, fp32 statistics.
    """
    return _adaln_op(_rows(x), _rows(shift), _rows(scale), eps).view(x.shape)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           activation: str = "none", gate: Optional[torch.Tensor] = None,
           residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`residual + gate · act(x @ weightᵀ + bias)` in one GEMM with a fused epilogue (DESIGN.md §10).

    Args:
        x: (..., K). On CUDA K must be a positive multiple of 64.
        weight: (N, K), nn.Linear layout (the packed layout of the CUDA kernel).
        bias: (N,) or None.
        activation: "none", "gelu_tanh" (GELU, tanh approximation) or "silu".
        gate: (..., N) flattening to G rows, broadcast over M/G consecutive rows (adaLN-Zero gate), or None.
        residual: (..., N) like x's rows, or None.
    Returns:
        (..., N) in x's dtype (bias, activation, gate and residual applied in fp32, rounded once).
    """
    out = _linear_op(_rows(x), weight, bias, activation, _rows(gate), _rows(residual))
    return out.view(*x.shape[:-1], weight.shape[0])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, positions: Optional[torch.Tensor] = None, *,
             theta: float = 10000.0, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim with `weight`, then rotate-half RoPE when `positions` is given.

    Args:
        x: (..., H, D): per-head QK-norm; for a whole-width RMSNorm pass `x.unsqueeze(-2)`.
        weight: (D,).
        positions: int64, x's row dims (e.g. (B, K) for x (B, K, H, D)): absolute positions, or None.
        theta: RoPE base; angle_i = position · theta^(−2i/D).
    Returns:
        x's shape and dtype.
    """
    rows = x.reshape(-1, x.shape[-2], x.shape[-1])
    pos = None if positions is None else positions.reshape(-1)
    return _rms_norm_op(rows, weight, pos, theta, eps).view(x.shape)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: Optional[torch.Tensor] = None, *,
              scale: Optional[float] = None) -> torch.Tensor:
    """Bidirectional multi-head attention of Sq queries over Skv keys (slot self-attention, or
    cross-attention over the memory cache), flash-decoding split over keys on CUDA.

    Args:
        q: (B, Sq, Hq, D). On CUDA D ∈ {64, 128}; strided views (e.g. of a fused qkv output) are fine.
        k, v: (B, Skv, Hkv, D), Hq % Hkv == 0 (query head h reads key head h // (Hq/Hkv)).
        kv_len: (B,) int32 — keys j >= kv_len[b] are ignored (memory rows past the committed length),
            or None for all Skv. A query with no valid key returns 0.
        scale: softmax scale, default 1/sqrt(D).
    Returns:
        (B, Sq, Hq, D) in q's dtype.
    Note: the CUDA grid depends on Skv (the cache capacity), never on kv_len, so a captured CUDA graph
    stays valid as the memory grows within its capacity.
    """
    return _attention_op(q, k, v, kv_len, 0.0 if scale is None else float(scale))


def kv_append_(cache: torch.Tensor, values: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> None:
    """In place: `cache[b, start[b] + t] = values[b, t]` for t < count[b]; rows outside [0, L) are dropped.

    Args:
        cache: (B, L, H, D), mutated (e.g. a transposed view of a [B, H, L, D] memory cache).
        values: (B, T, H, D).
        start, count: (B,) int32 on cache's device.
    Note: data-dependent positions come from device tensors, so appending never syncs the host.
    """
    _kv_append_op(cache, values, start, count)


class LmHeadOutput(NamedTuple):
    tokens: torch.Tensor            # (M,) int64: argmax over the first valid_vocab columns
    logits: Optional[torch.Tensor]  # (M, V) fp32 (soft-capped), or None when not asked for


def lm_head(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
            valid_vocab: Optional[int] = None, return_logits: bool = False, softcap: float = 0.0) -> LmHeadOutput:
    """LM-head GEMM with a fused per-row argmax: no (M, V) logits are written unless asked for.

    Args:
        x: (..., K) final hidden states; weight: (V, K) LM head; bias: (V,) or None.
        valid_vocab: only ids < valid_vocab compete in the argmax (padded vocab rows); default V.
        return_logits: also return the fp32 logits (e.g. for the 2-step midpoint softmax).
        softcap: > 0 applies `softcap·tanh(logits/softcap)` (to the argmax input and the logits).
    Returns:
        LmHeadOutput(tokens (...,) int64 — torch.argmax order: lowest index wins ties, NaN wins —
        and logits (..., V) fp32 or None).
    """
    tokens, logits = _lm_head_op(_rows(x), weight, bias, valid_vocab or 0, return_logits, softcap)
    lead = x.shape[:-1]
    return LmHeadOutput(tokens.view(lead), logits.view(*lead, weight.shape[0]) if return_logits else None)

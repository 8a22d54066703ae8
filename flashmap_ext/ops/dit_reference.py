"""Pure-PyTorch references of the DiT drafter ops (torch.ops.flashmap.dit_*): the test oracles.

Each function has the op's signature plus `dtype`, the precision the math runs in:
- float64 (default) or float32: the oracle; plain formulas, every intermediate in `dtype`.
- bfloat16 / float16: "the low-precision PyTorch version" of the error-budget rule (DESIGN.md §10,
  DESIGN.md §10): the same ops the drafter module runs in that dtype (F.layer_norm,
  F.linear, SDPA, a bf16 LM head), each rounding its output. A kernel passes when its error against the
  fp64 oracle is at most twice this version's error.
Kernels: csrc/dit/norm.cu (adaln, rms_norm), linear_kernel.cuh (linear, lm_head), attention_kernel.cuh
(attention), attention.cu (kv_append); CPU twins in csrc/dit/dit_cpu.cpp.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

_EXACT = (torch.float32, torch.float64)


def _per_row(cond: torch.Tensor, rows: int) -> torch.Tensor:
    """[G, N] -> [rows, N]: conditioning row g serves rows [g·rows/G, (g+1)·rows/G)."""
    return cond.repeat_interleave(rows // cond.shape[0], dim=0)


def adaln(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6, *,
          dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x [M, N], shift/scale [G, N] -> LayerNorm(x) (no affine)·(1 + scale) + shift, [M, N] in `dtype`."""
    x, shift, scale = (t.to(dtype) for t in (x, shift, scale))
    if dtype in _EXACT:
        xc = x - x.mean(-1, keepdim=True)
        h = xc / torch.sqrt(xc.square().mean(-1, keepdim=True) + eps)
    else:
        h = F.layer_norm(x, (x.shape[-1],), eps=eps)
    return h * (1 + _per_row(scale, x.shape[0])) + _per_row(shift, x.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: str = "none",
           gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None, *,
           dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x [M, K], weight [N, K] -> residual + gate·act(x @ weightᵀ + bias), [M, N] in `dtype`."""
    cast = lambda t: None if t is None else t.to(dtype)
    y = F.linear(cast(x), cast(weight), cast(bias))
    if activation == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif activation == "silu":
        y = F.silu(y)
    elif activation != "none":
        raise ValueError(f"activation: expected 'none', 'gelu_tanh' or 'silu', got {activation!r}")
    if gate is not None:
        y = y * _per_row(cast(gate), x.shape[0])
    return y if residual is None else cast(residual) + y


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of x [M, H, D] at positions [M]; angles computed in x's dtype (fp32 for bf16)."""
    D = x.shape[-1]
    ct = x.dtype if x.dtype in _EXACT else torch.float32
    inv_freq = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=ct) / D)
    angle = torch.cat([positions.to(ct)[:, None] * inv_freq] * 2, dim=-1)[:, None]  # [M, 1, D]
    x1, x2 = x.chunk(2, dim=-1)
    return x * angle.cos().to(x.dtype) + torch.cat([-x2, x1], dim=-1) * angle.sin().to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, positions: Optional[torch.Tensor] = None,
             theta: float = 10000.0, eps: float = 1e-6, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x [M, H, D], weight [D] -> x·rsqrt(mean(x²) + eps)·weight, then RoPE at positions [M] if given.

    Low precision follows the drafter's RMSNorm (statistics in fp32, one cast) and RoPE (in `dtype`).
    """
    stat = dtype if dtype in _EXACT else torch.float32
    xs = x.to(stat)
    h = (weight.to(stat) * xs * torch.rsqrt(xs.square().mean(-1, keepdim=True) + eps)).to(dtype)
    return h if positions is None else rope(h, positions, theta)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: Optional[torch.Tensor] = None,
              scale: float = 0.0, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q [B, Sq, Hq, D], k/v [B, Skv, Hkv, D], kv_len [B] -> softmax(scale·q·kᵀ) v over keys j < kv_len[b],
    [B, Sq, Hq, D] in `dtype`; a query with no valid key gives 0 (low precision: SDPA, NaN there)."""
    B, Sq, Hq, D = q.shape
    Skv, groups = k.shape[1], Hq // k.shape[2]
    scale = scale if scale > 0 else 1.0 / math.sqrt(D)
    qh, kh, vh = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    kh, vh = kh.repeat_interleave(groups, 1), vh.repeat_interleave(groups, 1)
    lens = torch.full((B,), Skv, device=q.device) if kv_len is None else kv_len.to(q.device).long()
    valid = (torch.arange(Skv, device=q.device)[None] < lens[:, None])[:, None, None]  # [B, 1, 1, Skv]
    vh = vh.masked_fill(~valid.transpose(-1, -2), 0)  # rows past kv_len may hold anything (NaN, inf)
    if dtype not in _EXACT:
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=valid, scale=scale).transpose(1, 2)
    s = (qh @ kh.transpose(-1, -2) * scale).masked_fill(~valid, -math.inf)
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0) if Skv else s.sum(-1, keepdim=True)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    return (p @ vh / torch.where(denom > 0, denom, torch.ones_like(denom))).transpose(1, 2)


def kv_append(cache: torch.Tensor, values: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Returns a copy of cache [B, L, H, D] with values[b, t] at row start[b] + t for t < count[b] (rows
    outside [0, L) dropped): the functional form of the in-place op."""
    out = cache.clone()
    for b in range(cache.shape[0]):
        for t in range(min(int(count[b]), values.shape[1])):
            row = int(start[b]) + t
            if 0 <= row < cache.shape[1]:
                out[b, row] = values[b, t]
    return out


def lm_head(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, valid_vocab: int = 0,
            return_logits: bool = False, softcap: float = 0.0, *,
            dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """x [M, K], weight [V, K] -> (tokens [M] int64 = argmax over ids < valid_vocab (<= 0: all) of the
    soft-capped logits, logits [M, V] (fp64 for the oracle, fp32 otherwise) or None).

    Low precision: logits rounded to `dtype` by the head GEMM, then soft-capped in fp32 (the drafter's
    `_trunk`)."""
    cast = lambda t: None if t is None else t.to(dtype)
    logits = F.linear(cast(x), cast(weight), cast(bias))
    logits = logits if dtype == torch.float64 else logits.float()
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    valid = weight.shape[0] if valid_vocab <= 0 else valid_vocab
    return logits[:, :valid].argmax(-1), (logits if return_logits else None)


# ---------------------------------------------------------------- the fused ops: the references above chained
def norm_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: str = "none",
                shift: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None, adaln_eps: float = 1e-6,
                q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None, heads: int = 0,
                positions: Optional[torch.Tensor] = None, theta: float = 10000.0, eps: float = 1e-6, *,
                dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """dit_norm_linear as adaln -> linear -> rms_norm of the leading `heads` (q, then k) head groups."""
    h = x if shift is None else adaln(x, shift, scale, adaln_eps, dtype=dtype)
    y = linear(h, weight, bias, activation, dtype=dtype)
    parts, col = [], 0
    for w in (q_norm, k_norm):
        if w is None:
            continue
        D = w.shape[0]
        part = y[:, col:col + heads * D].reshape(y.shape[0], heads, D)
        parts.append(rms_norm(part, w, positions, theta, eps, dtype=dtype).reshape(y.shape[0], heads * D))
        col += heads * D
    return torch.cat(parts + [y[:, col:]], dim=1)


def linear_kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     bias: Optional[torch.Tensor], k_norm: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
                     theta: float = 10000.0, eps: float = 1e-6, *,
                     dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """dit_linear_kv_append as linear -> rms_norm (+ RoPE at start[b] + t) -> kv_append per layer; returns new
    (k_cache, v_cache) in `dtype` (the functional form of the in-place op)."""
    B, T, _ = x.shape
    layers, _, _, H, D = k_cache.shape
    y = linear(x.reshape(B * T, -1), weight, bias, dtype=dtype).view(B, T, layers, 2, H, D)
    pos = (start.long()[:, None] + torch.arange(T, device=x.device)).reshape(-1)
    ks, vs = [], []
    for layer in range(layers):
        k = rms_norm(y[:, :, layer, 0].reshape(B * T, H, D), k_norm[layer], pos, theta, eps, dtype=dtype)
        ks.append(kv_append(k_cache[layer].to(dtype), k.view(B, T, H, D), start, count))
        vs.append(kv_append(v_cache[layer].to(dtype), y[:, :, layer, 1], start, count))
    return torch.stack(ks), torch.stack(vs)

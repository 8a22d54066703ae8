"""Qwen3/Llama building blocks shared by the drafters (RMSNorm, RoPE, SwiGLU MLP, attention over a K/V prefix).

Numerics follow transformers' Qwen3 modules (`modeling_qwen3.py`, used directly where they fit): RMSNorm
computes in fp32; RoPE uses the rotate-half convention with cos/sin computed in fp32 and cast to the
activation dtype. The FlashMap drafter's variants (scale_in_fp32, kernel_freqs) mirror its fused kernels.
Parameter names (`q_proj`, `k_norm`, `gate_proj`, ...) match HF checkpoints so released weights load
unchanged. Shapes: B batch, L tokens, H query heads, G key/value heads, hd head dim.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, rotate_half


class RMSNorm(Qwen3RMSNorm):
    """transformers' `Qwen3RMSNorm`: y = w · x / sqrt(mean(x²) + eps), normalised in fp32 and cast back to
    x's dtype before the scale. scale_in_fp32=True scales in fp32 and rounds once instead, as the fused
    DiT kernels do (csrc/dit/norm.cu): the FlashMap drafter's norms."""

    def __init__(self, dim: int, eps: float = 1e-6, *, scale_in_fp32: bool = False):
        super().__init__(dim, eps)
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.scale_in_fp32:
            return super().forward(x)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * h).to(x.dtype)


class Rotary(nn.Module):
    """RoPE tables: positions [B, L] int64 -> (cos, sin) [B, L, hd] in `dtype`, angles in fp32.

    Frequencies 1/θ^(2i/hd) as transformers' Qwen3 (DFlash, EAGLE-3); kernel_freqs=True uses θ^(−2i/hd), as
    the fused DiT kernels (csrc/dit/norm.cu) and the FlashMap drafter. `scaling`: None (default RoPE) or
    an HF `rope_parameters` dict without `rope_theta` (`rope_type` "linear" | "llama3" | "yarn" | ...),
    whose inverse frequencies and attention factor come from transformers' `ROPE_INIT_FUNCTIONS` (as the
    reference `Qwen3RotaryEmbedding`); `model_shape` then gives the HF config fields those functions read
    (hidden_size, num_attention_heads, max_position_embeddings). Types whose tables depend on the sequence
    length (dynamic, longrope) raise ValueError naming `rope_type`.
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None, model_shape: dict | None = None,
                 *, kernel_freqs: bool = False):
        super().__init__()  # no buffers: nothing to store, nothing left on a meta device after loading
        self.head_dim, self.theta, self.kernel_freqs = head_dim, theta, kernel_freqs
        self._scaled = None if not scaling else scaled_inv_freq(head_dim, theta, scaling, model_shape or {})

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=positions.device).float()
        if self._scaled is not None:
            inv_freq = self._scaled[0].to(positions.device)
        elif self.kernel_freqs:
            inv_freq = self.theta ** (-exponent / self.head_dim)
        else:
            inv_freq = 1.0 / self.theta ** (exponent / self.head_dim)
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        if self._scaled is None:
            return emb.cos().to(dtype), emb.sin().to(dtype)
        factor = self._scaled[1]
        return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)


SEQUENCE_DEPENDENT_ROPE = ("dynamic", "longrope")


def scaled_inv_freq(head_dim: int, theta: float, scaling: dict, model_shape: dict) -> tuple[torch.Tensor, float]:
    """(inv_freq [hd/2] fp32 on CPU, attention factor) of a scaled RoPE, from transformers' own
    `ROPE_INIT_FUNCTIONS` applied to a Qwen3 config of this shape."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    kind = scaling.get("rope_type")
    if kind in SEQUENCE_DEPENDENT_ROPE or kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_scaling.rope_type={kind!r} is not supported (supported: default, "
                         f"{', '.join(k for k in ROPE_INIT_FUNCTIONS if k not in SEQUENCE_DEPENDENT_ROPE)})")
    config = Qwen3Config(**{**model_shape, "head_dim": head_dim,
                            "rope_parameters": {**scaling, "rope_theta": theta}})
    with torch.device("cpu"):  # also when the drafter is being built on the meta device
        inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](config, device="cpu")
    return inv_freq.float(), float(factor)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, L, hd]; cos/sin [B, L, hd]. Rotate-half RoPE (transformers' `apply_rotary_pos_emb`)."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def swiglu(dim: int, hidden: int) -> nn.Module:
    """transformers' `Qwen3MLP`: down(silu(gate(x)) · up(x)), no biases."""
    return Qwen3MLP(SimpleNamespace(hidden_size=dim, intermediate_size=hidden, hidden_act="silu"))


class Attention(nn.Module):
    """GQA attention whose queries attend to a given K/V prefix followed by their own K/V.

    `qk_norm=True` adds Qwen3's per-head RMSNorm on q and k (before RoPE). `in_dim` may differ from
    the output width (EAGLE-3 feeds [embedding ‖ feature], 2·d wide, to q/k/v).
    """

    def __init__(self, in_dim: int, out_dim: int, heads: int, kv_heads: int, head_dim: int,
                 qk_norm: bool, eps: float, bias: bool = False):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, out_dim, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def _heads(self, y: torch.Tensor, n: int, norm: RMSNorm | None) -> torch.Tensor:
        y = y.view(*y.shape[:2], n, self.head_dim)
        return (norm(y) if norm is not None else y).transpose(1, 2)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, L, in_dim] -> (k, v) [B, G, L, hd]; k normed and rotated (what a KV cache stores)."""
        k = apply_rope(self._heads(self.k_proj(x), self.kv_heads, self.k_norm), cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads, None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                prefix_k: torch.Tensor | None = None, prefix_v: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, L, in_dim]; prefix_k/v [B, G, P, hd] or None; mask: bool [B|1, 1, L, P+L], True = visible,
        None = everything visible. Returns (out [B, L, out_dim], k_x, v_x [B, G, L, hd])."""
        q = apply_rope(self._heads(self.q_proj(x), self.heads, self.q_norm), cos, sin)
        k_x, v_x = self.kv(x, cos, sin)
        k = k_x if prefix_k is None else torch.cat([prefix_k, k_x], dim=2)
        v = v_x if prefix_v is None else torch.cat([prefix_v, v_x], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1)), k_x, v_x


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """HF-style init: Linear ~ N(0, std²), zero bias; norms keep their ones."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

"""The decoder math of `StaticTarget` (static.py): a plain-PyTorch Qwen3 / Qwen2 / Llama forward over weights
borrowed from the HF model, reading and writing static KV buffers at positions computed on the device.

Nothing here reads a tensor's value on the host, so the whole forward can be captured as one CUDA graph.
The numerics follow HF transformers: RMSNorm in fp32 and cast back before the weight, q/k RMSNorm per head
(Qwen3) before RoPE, the rotary tables of the HF model's own rotary embedding, SDPA with scale hd^-0.5,
residual adds in the model's dtype, SiLU-gated MLP.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from flashmap_ext.checks import with_article


@dataclass
class LayerWeights:
    """One decoder layer's weights. qkv and gate_up are the HF projections concatenated along the output
    features (one GEMM each); the norms are the HF modules' weight tensors (shared, not copied)."""
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: Optional[torch.Tensor]
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    o: torch.Tensor
    o_bias: Optional[torch.Tensor]
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def _cat_bias(*linears: nn.Linear) -> Optional[torch.Tensor]:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else lin.weight.new_zeros(lin.weight.shape[0])
                      for b, lin in zip(biases, linears)])


def layer_weights(layer: nn.Module) -> LayerWeights:
    """The weights of one HF decoder layer (Qwen3 / Qwen2 / Llama layout); TypeError naming what is missing
    or unsupported (an MLP bias, a non-SiLU activation)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    needed = [(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
             [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
    missing = [n for owner, n in needed if not isinstance(getattr(owner, n, None), nn.Linear)]
    if missing or not hasattr(layer, "input_layernorm") or not hasattr(layer, "post_attention_layernorm"):
        raise TypeError(f"StaticTarget: {with_article(type(layer).__name__)} is not a Qwen3/Qwen2/Llama decoder layer "
                        f"(missing {', '.join(missing) or 'its layer norms'})")
    if any(getattr(mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        raise TypeError("StaticTarget: MLP biases are not supported (mlp_bias=True)")
    act = getattr(mlp, "act_fn", None)
    if not isinstance(act, nn.SiLU) and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        raise TypeError(f"StaticTarget: the MLP activation must be SiLU, got {type(act).__name__}")
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    with torch.no_grad():
        return LayerWeights(
            input_norm=layer.input_layernorm.weight,
            qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            qkv_bias=_cat_bias(attn.q_proj, attn.k_proj, attn.v_proj),
            q_norm=None if q_norm is None else q_norm.weight, k_norm=None if k_norm is None else k_norm.weight,
            o=attn.o_proj.weight, o_bias=attn.o_proj.bias, post_norm=layer.post_attention_layernorm.weight,
            gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), down=mlp.down_proj.weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalise in fp32, cast back to x's dtype, then scale by the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd], cos/sin [T, hd]: HF's apply_rotary_pos_emb."""
    return x * cos + _rotate_half(x) * sin


def attention_block(x: torch.Tensor, w: LayerWeights, s: Shape, kv: tuple, pos: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Self-attention of new tokens x [B, T, d] at absolute positions pos [T] (a device tensor): writes their
    K/V into kv = (k [B, Hkv, cap, hd], v) at `pos`, attends over all cap slots under `visible` [T, cap]."""
    B, T, _ = x.shape
    qkv = F.linear(rms_norm(x, w.input_norm, s.eps), w.qkv, w.qkv_bias)
    q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
    q, k, v = (t.view(B, T, -1, s.head_dim) for t in (q, k, v))
    if w.q_norm is not None:
        q, k = rms_norm(q, w.q_norm, s.eps), rms_norm(k, w.k_norm, s.eps)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k_cache, v_cache = kv
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    # GQA as one attention per KV head over its g query heads stacked along the rows (HF's repeat_kv pairs
    # query head h with KV head h // g): any SDPA backend takes it, with no repeated K/V.
    g = s.heads // s.kv_heads
    q = q.reshape(B, s.kv_heads, g * T, s.head_dim)
    out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=visible.repeat(g, 1),
                                         scale=s.head_dim ** -0.5)
    return F.linear(out.reshape(B, s.heads, T, s.head_dim).transpose(1, 2).reshape(B, T, -1), w.o, w.o_bias)


def mlp_block(x: torch.Tensor, w: LayerWeights, s: Shape) -> torch.Tensor:
    gate, up = F.linear(rms_norm(x, w.post_norm, s.eps), w.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w.down)


def decoder_forward(x: torch.Tensor, layers: Sequence[LayerWeights], s: Shape, kv: Sequence[tuple],
                    pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                    final_norm: torch.Tensor, tap_layer_ids: Sequence[int]) -> tuple:
    """All layers over x [B, T, d]: (the final-normed hidden [B, T, d], [tap i for i in tap_layer_ids]);
    the last layer's tap is after the final norm (HF hidden_states[L], taps.py)."""
    taps = {}
    for i, w in enumerate(layers):
        x = x + attention_block(x, w, s, kv[i], pos, cos, sin, visible)
        x = x + mlp_block(x, w, s)
        if i in tap_layer_ids and i != len(layers) - 1:
            taps[i] = x
    x = rms_norm(x, final_norm, s.eps)
    taps[len(layers) - 1] = x
    return x, [taps[i] for i in tap_layer_ids]

"""Layers of the FlashMap DiT drafter (DESIGN.md §5.2): adaLN-Zero blocks with slot self-attention,
cross-attention to the context memory, and an MLP; or, with `joint`, one attention over the memory and the
block's own slots (DFlash's layout) in place of the two.

adaLN-Zero follows Peebles & Xie, "Scalable Diffusion Models with Transformers" (arXiv:2212.09748 §3.2,
facebookresearch/DiT models.py): LayerNorm without affine (eps 1e-6), `mod(h) = h·(1+scale) + shift`,
gated residuals whose modulation Linear starts at zero. The two-time conditioning `c = SiLU(Emb_s(τ_s) +
Emb_t(τ_t))` is FMLM's (Lee et al. 2026, arXiv:2602.16813; models/dit.py). Shapes: B batch, A blocks per
sequence (anchors), K slots per block, S memory entries, w width, h heads, hd = w/h.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from flashmap_ext.drafters.common.layers import RMSNorm, Rotary, apply_rope


class TimestepEmbedder(nn.Module):
    """τ [N] -> [N, cond_dim]: sinusoidal(256) of `scale·τ` -> Linear -> SiLU -> Linear (DiT §3.2).

    `scale` (default 1000) maps τ ∈ [0, 1] onto DiT's 0..1000 step range so that the sinusoid's
    frequencies (max period 10⁴) actually vary over τ (FLM feeds raw τ).
    """

    def __init__(self, cond_dim: int, scale: float, freq_dim: int = 256):
        super().__init__()
        self.scale, self.freq_dim = scale, freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, tau: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=tau.device, dtype=torch.float32) / half)
        args = (self.scale * tau.float())[..., None] * freqs
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(emb.to(self.mlp[0].weight.dtype))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """mod(h) = h·(1 + scale) + shift; x [B, A, K, w], shift/scale [B, A, w] (broadcast over slots)."""
    return x * (1.0 + scale[:, :, None]) + shift[:, :, None]


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """[B, L, w] -> [B, h, L, hd]."""
    return x.unflatten(-1, (h, -1)).transpose(1, 2)


class SlotSelfAttention(nn.Module):
    """Bidirectional attention over the K slots of each block, with per-head RMS QK-norm (as Qwen3)."""

    def __init__(self, width: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.q_norm, self.k_norm = (RMSNorm(width // heads, eps, scale_in_fp32=True) for _ in range(2))
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, K, w] -> [N, K, w]."""
        q, k, v = (_heads(p, self.heads) for p in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v)
        return self.out(y.transpose(1, 2).flatten(-2))


class MemoryCrossAttention(nn.Module):
    """Slots (queries) attend to the memory (keys/values), RoPE on absolute positions, QK-norm.

    K/V of memory entries depend only on the entry and its position, so they are computed once per
    committed position and cached (DESIGN.md §5.3) through `memory_kv`.
    """

    def __init__(self, width: int, heads: int, eps: float, rope_theta: float, memory_width: int | None = None):
        super().__init__()
        self.heads, self.rotary = heads, Rotary(width // heads, rope_theta, kernel_freqs=True)
        mw = width if memory_width is None else memory_width  # the memory entries' width
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(width, width), nn.Linear(mw, width), nn.Linear(mw, width)
        self.q_norm, self.k_norm = (RMSNorm(width // heads, eps, scale_in_fp32=True) for _ in range(2))
        self.out = nn.Linear(width, width)

    def memory_kv(self, mem: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mem [B, S, memory width], positions [B, S] -> (k, v) each [B, h, S, hd] (k normed and rotated)."""
        k = self.k_norm(_heads(self.k_proj(mem), self.heads))
        k = apply_rope(k, *self.rotary(positions, k.dtype))
        return k, _heads(self.v_proj(mem), self.heads)

    def forward(self, x: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, Q, w], q_pos [B, Q], k/v [B, h, S, hd], mask None or bool [B, 1, Q, S] -> [B, Q, w]."""
        q = self.q_norm(_heads(self.q_proj(x), self.heads))
        q = apply_rope(q, *self.rotary(q_pos, q.dtype))
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
        return self.out(y.transpose(1, 2).flatten(-2))


class JointAttention(MemoryCrossAttention):
    """DFlash's layout: slots attend, in one softmax, to the memory entries they may read and to every slot
    of their own block; the slots' keys/values come from the same projections as the memory's (K normed and
    rotated to the slot's position, as the queries)."""

    def forward(self, x: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, block_size: int) -> torch.Tensor:
        """x [B, Q, w] (Q = A·K: A blocks of K = block_size slots), q_pos [B, Q], k/v [B, h, S, hd] of the
        memory, mask None or bool [B, 1, Q, S] over the memory -> [B, Q, w]."""
        B, Q, _ = x.shape
        rope = self.rotary(q_pos, x.dtype)
        q = apply_rope(self.q_norm(_heads(self.q_proj(x), self.heads)), *rope)
        k_slots = apply_rope(self.k_norm(_heads(self.k_proj(x), self.heads)), *rope)
        keys = torch.cat([k.to(q.dtype), k_slots], dim=2)
        values = torch.cat([v.to(q.dtype), _heads(self.v_proj(x), self.heads)], dim=2)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=joint_mask(mask, B, Q, k.shape[2], block_size,
                                                                                 x.device))
        return self.out(y.transpose(1, 2).flatten(-2))


def joint_mask(mask: torch.Tensor | None, B: int, Q: int, S: int, block_size: int,
               device: torch.device) -> torch.Tensor:
    """bool [B, 1, Q, S + Q]: the memory part `mask` (None: every entry), then query slot i may read slot j
    iff both lie in the same block (i // block_size == j // block_size)."""
    block = torch.arange(Q, device=device) // block_size
    own = (block[:, None] == block[None, :]).expand(B, 1, Q, Q)
    memory = torch.ones(B, 1, Q, S, dtype=torch.bool, device=device) if mask is None else mask.expand(B, 1, Q, S)
    return torch.cat([memory, own], dim=-1)


class DiTBlock(nn.Module):
    """One adaLN-Zero block: self-attn over slots, cross-attn to memory, MLP (DESIGN.md §5.2); with `joint`,
    one `JointAttention` over memory and slots (still called `cross_attn`: it owns the memory's K/V), then
    the MLP."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, cond_dim: int, eps: float, rope_theta: float,
                 joint: bool = False, memory_width: int | None = None):
        super().__init__()
        self.eps, self.joint = eps, joint
        self.self_attn = None if joint else SlotSelfAttention(width, heads, eps)
        self.cross_attn = (JointAttention if joint else MemoryCrossAttention)(width, heads, eps, rope_theta,
                                                                              memory_width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width))
        self.adaLN = nn.Linear(cond_dim, (6 if joint else 9) * width)

    def memory_kv(self, mem: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory entries' keys/values for this block (`MemoryCrossAttention.memory_kv`)."""
        return self.cross_attn.memory_kv(mem, positions)

    def forward(self, x: torch.Tensor, c: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                q_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, A, K, w]; c [B, A, cond_dim]; kv of the memory [B, h, S, hd]; q_pos [B, A·K]."""
        B, A, K, w = x.shape
        mods = list(self.adaLN(c).chunk(6 if self.joint else 9, dim=-1))
        if not self.joint:
            sh, sc, g = mods[:3]
            del mods[:3]
            h = modulate(F.layer_norm(x, (w,), eps=self.eps), sh, sc)
            x = x + g[:, :, None] * self.self_attn(h.reshape(B * A, K, w)).view(B, A, K, w)
        sh2, sc2, g2, sh3, sc3, g3 = mods
        h = modulate(F.layer_norm(x, (w,), eps=self.eps), sh2, sc2).reshape(B, A * K, w)
        y = self.cross_attn(h, q_pos, *kv, mask, K) if self.joint else self.cross_attn(h, q_pos, *kv, mask)
        x = x + g2[:, :, None] * y.view(B, A, K, w)
        h = modulate(F.layer_norm(x, (w,), eps=self.eps), sh3, sc3)
        return x + g3[:, :, None] * self.mlp(h)


class FinalLayer(nn.Module):
    """adaLN (shift, scale) -> Linear(w -> d_target); the target's frozen LM head follows (DESIGN.md §5.2).
    With `head_mlp` H, a residual MLP at the target's width follows the Linear, y + down(GELU(up(RMSNorm(y))))
    with H hidden units, so the hidden state the LM head reads is not confined to a w-dim subspace."""

    def __init__(self, width: int, cond_dim: int, d_target: int, eps: float, head_mlp: int | None = None):
        super().__init__()
        self.eps = eps
        self.adaLN = nn.Linear(cond_dim, 2 * width)
        self.out = nn.Linear(width, d_target)
        self.head_norm = None if head_mlp is None else RMSNorm(d_target, eps, scale_in_fp32=True)
        self.head_mlp = None if head_mlp is None else nn.Sequential(
            nn.Linear(d_target, head_mlp), nn.GELU(approximate="tanh"), nn.Linear(head_mlp, d_target))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x [B, A, K, w], c [B, A, cond_dim] -> [B, A, K, d_target]."""
        shift, scale = self.adaLN(c).chunk(2, dim=-1)
        y = self.out(modulate(F.layer_norm(x, (x.shape[-1],), eps=self.eps), shift, scale))
        return y if self.head_mlp is None else y + self.head_mlp(self.head_norm(y))

"""The FlashMap drafter's "qwen3" trunk (FlashMapConfig.trunk, DESIGN.md §5.2): DFlash's decoder layer in the
flow model. Each layer is pre-norm Qwen3: one grouped-query attention whose keys are the memory entries a
slot may read and every slot of its own block (QK-norm, RoPE at absolute positions), then a SwiGLU MLP. The
time conditioning enters once, added to the slot tokens (`FlashMapDrafter.time_in`), and the final RMSNorm
feeds the target's LM head directly: no adaLN, no projection to d_target. Shapes as block.py.
"""
from __future__ import annotations

import torch
from torch import nn

from flashmap_ext.drafters.common.layers import Attention, RMSNorm, Rotary, swiglu
from flashmap_ext.drafters.flashmap.block import joint_mask


class QwenBlock(nn.Module):
    """x + attn(norm(x)) over [memory ‖ own block], then x + mlp(norm(x)); `memory_kv` projects entries."""

    def __init__(self, width: int, heads: int, kv_heads: int, mlp_hidden: int, eps: float, rope_theta: float):
        super().__init__()
        head_dim = width // heads
        self.attn = Attention(width, width, heads, kv_heads, head_dim, qk_norm=True, eps=eps)
        self.mlp = swiglu(width, mlp_hidden)
        self.input_norm, self.post_norm = RMSNorm(width, eps), RMSNorm(width, eps)
        self.rotary = Rotary(head_dim, rope_theta, kernel_freqs=True)

    def memory_kv(self, mem: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mem [B, S, w], positions [B, S] -> (k, v) each [B, G, S, hd] (k normed and rotated)."""
        return self.attn.kv(mem, *self.rotary(positions, mem.dtype))

    def forward(self, x: torch.Tensor, c: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                q_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, A, K, w]; c unused (the conditioning entered with the slot tokens); kv of the memory
        [B, G, S, hd]; q_pos [B, A·K]; mask None or bool [B, 1, A·K, S] over the memory -> [B, A, K, w]."""
        B, A, K, w = x.shape
        k, v = kv
        h = x.reshape(B, A * K, w)
        cos, sin = self.rotary(q_pos, h.dtype)
        visible = joint_mask(mask, B, A * K, k.shape[2], K, x.device)
        h = h + self.attn(self.input_norm(h), cos, sin, k.to(h.dtype), v.to(h.dtype), visible)[0]
        h = h + self.mlp(self.post_norm(h))
        return h.view(B, A, K, w)

    def identity_init(self) -> None:
        """Zeroes the residual outputs (attention o_proj, MLP down_proj): the layer passes its input on."""
        nn.init.zeros_(self.attn.o_proj.weight)
        nn.init.zeros_(self.mlp.down_proj.weight)


class NormHead(nn.Module):
    """The qwen3 trunk's final layer: RMSNorm(w) (w = d_target), read by the target's LM head."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(width, eps)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x [B, A, K, w], c unused -> [B, A, K, w]."""
        return self.norm(x)

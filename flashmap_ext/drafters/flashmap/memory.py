"""What a FlashMap draft call reads and returns: the incremental context memory (DESIGN.md §5.3), the
training-time memory of whole sequences with many anchors, per-row seeds/positions and the DraftBlock.

Both hold, per DiT layer, the cross-attention K/V of memory entries (k RMS-normed and rotated to the
entry's absolute position), so each committed position is projected once per layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from flashmap_ext.drafters.common.window import visible_context

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class FlashMapMemory:
    """Cross-attention K/V of committed positions 0..length−1 for B sequences of equal length.

    k, v: [n_layers, B, h, capacity, hd] in the drafter's dtype; entries at and after `length` are
    scratch (the anchor of the current draft is written at index `length`, never counted).
    Rejected positions never enter: the decoding loop only calls `extend_memory` with committed tokens.
    """
    k: torch.Tensor
    v: torch.Tensor
    length: int = 0
    #: CUDA graphs of the fused draft step captured against k and v (fused.py): they
    #: read the buffers by address, so `reserve` drops them when it reallocates.
    draft_graphs: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def empty(cls, n_layers: int, batch_size: int, heads: int, head_dim: int, device: torch.device,
              dtype: torch.dtype, capacity: int = 64) -> "FlashMapMemory":
        shape = (n_layers, batch_size, heads, capacity, head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def batch_size(self) -> int:
        """B, the sequences held."""
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        """Entries that fit before `reserve` grows the buffers."""
        return self.k.shape[3]

    def reserve(self, n: int) -> None:
        """Grows the buffers (doubling) so that `n` entries fit."""
        if n <= self.capacity:
            return
        new_cap = max(n, 2 * self.capacity)
        pad = (0, 0, 0, new_cap - self.capacity)
        self.k = torch.nn.functional.pad(self.k, pad)
        self.v = torch.nn.functional.pad(self.v, pad)
        self.draft_graphs.clear()

    def write(self, start: int, kv: list[KV]) -> None:
        """Writes per-layer K/V [B, h, T, hd] at entries start..start+T−1 (does not change `length`)."""
        n = kv[0][0].shape[2]
        self.reserve(start + n)
        for layer, (k, v) in enumerate(kv):
            self.k[layer, :, :, start:start + n] = k
            self.v[layer, :, :, start:start + n] = v

    def layer_kv(self, layer: int, n: int, start: int = 0) -> KV:
        """Views of entries start..n−1 of one layer: [B, h, n − start, hd] each."""
        return self.k[layer, :, :, start:n], self.v[layer, :, :, start:n]


@dataclass
class TrainMemory:
    """Memory of B whole sequences for A anchors each (training, DESIGN.md §8).

    kv: per layer, K/V [B, h, T, hd] of the projected taps at every position 0..T−1.
    anchor_kv: per layer, K/V [B, h, A, hd] of each anchor's embedding at its position.
    anchor_pos: [B, A] int64. Block a of row b sees taps at positions < anchor_pos[b, a] and its own
    anchor entry, nothing else (the mask is built in `mask`).
    """
    kv: list[KV]
    anchor_kv: list[KV]
    anchor_pos: torch.Tensor

    def select(self, cols: torch.Tensor) -> "TrainMemory":
        """The same memory for a subset of anchor columns `cols` [A'] int64."""
        return TrainMemory(self.kv, [(k[:, :, cols], v[:, :, cols]) for k, v in self.anchor_kv],
                           self.anchor_pos[:, cols])

    def layer_kv(self, layer: int) -> KV:
        """Keys/values [B, h, T + A, hd]: the sequence's entries, then one entry per anchor."""
        (k, v), (ka, va) = self.kv[layer], self.anchor_kv[layer]
        return torch.cat([k, ka], dim=2), torch.cat([v, va], dim=2)

    def mask(self, block_size: int, window: int | None = None) -> torch.Tensor:
        """bool [B, 1, A·K, T + A]: query slot (a, k) may attend position j < anchor_pos[a] (and, with a
        context window W, j >= anchor_pos[a] − W), and anchor a."""
        B, A = self.anchor_pos.shape
        T = self.kv[0][0].shape[2]
        device = self.anchor_pos.device
        seq = visible_context(self.anchor_pos, T, window)  # [B, A, T]
        own = torch.eye(A, dtype=torch.bool, device=device)[None].expand(B, A, A)  # [B, A, A]
        mask = torch.cat([seq, own], dim=-1)  # [B, A, T + A]
        return mask[:, :, None, :].expand(B, A, block_size, T + A).reshape(B, 1, A * block_size, T + A)


class DraftBlock(NamedTuple):
    """tokens [B, K] int64 target ids; logits [B, K, V_s] fp32 of the last evaluation, or None."""
    tokens: torch.Tensor
    logits: torch.Tensor | None


def per_row(value: torch.Tensor | int, batch_size: int, device: torch.device,
            name: str = "seed/position") -> torch.Tensor:
    """A seed or position as [B] int64 on `device`: a tensor ([B] or [1]) is moved there (no copy when
    it already lives there), an int is filled in on the device (no host-to-device transfer).
    Raises ValueError naming `name` for a non-integer tensor or one that is neither [B] nor [1]."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool \
                or value.numel() not in (1, batch_size) or value.dim() > 1:
            raise ValueError(f"{name}: expected an int or a [B={batch_size}] (or [1]) integer tensor, got "
                             f"{list(value.shape)} {value.dtype}")
        return value.to(device=device, dtype=torch.int64).reshape(-1).expand(batch_size)
    return torch.full((batch_size,), int(value), dtype=torch.int64, device=device)

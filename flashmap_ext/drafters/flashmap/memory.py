"""What a FlashMap draft call reads and returns: the incremental context memory (DESIGN.md §5.3), the
training-time memory of whole sequences with many anchors, per-row seeds/positions and the DraftBlock.

Both hold, per DiT layer, the cross-attention K/V of memory entries (k RMS-normed and rotated to the
entry's absolute position), so each committed position is projected once per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flashmap_ext.drafters.common.base import DraftBlock, RaggedRows, per_row  # noqa: F401  (their home is common/)
from flashmap_ext.drafters.common.window import visible_context

KV = tuple[torch.Tensor, torch.Tensor]


class FlashMapMemory(RaggedRows):
    """Cross-attention K/V of B sequences; row b holds its committed positions 0..lengths[b]−1 (rows may
    differ: a ragged batch, DESIGN.md §5.3).

    k, v: [n_layers, B, h, capacity, hd] in the drafter's dtype; row b's entries at and after lengths[b]
    are scratch (the anchor of the current draft is written at index lengths[b], never counted).
    lengths: [B] int64 on the CPU (each row's anchor position; read without a device sync).
    Rejected positions never enter: `extend_memory` appends T positions to every row, `truncate` then
    cuts each row back to the positions it committed.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int = 0, lengths=None):
        self.k, self.v = k, v
        #: row lengths as Python ints: no device sync, and torch.compile sees constants
        self.rows = [int(length)] * k.shape[1] if lengths is None else [int(n) for n in lengths]
        #: CUDA graphs of the fused draft step captured against k and v (fused.py): they
        #: read the buffers by address, so `reserve` drops them when it reallocates.
        self.draft_graphs: dict = {}

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

    def write(self, start, kv: list[KV]) -> None:
        """Writes per-layer K/V [B, h, T, hd] at entries start..start+T−1 of every row (an int), or of row
        b from start[b] (a list of B ints); does not change the lengths."""
        n = kv[0][0].shape[2]
        starts = [int(start)] * self.batch_size if isinstance(start, int) else list(start)
        self.reserve(max(starts) + n)
        rows = [(slice(None), starts[0])] if len(set(starts)) == 1 else list(enumerate(starts))
        for layer, (k, v) in enumerate(kv):
            for b, s in rows:
                self.k[layer, b, :, s:s + n] = k[b]
                self.v[layer, b, :, s:s + n] = v[b]

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


def ragged_mask(lengths: torch.Tensor, start: int, window: int | None, num_slots: int) -> torch.Tensor:
    """bool [B, 1, K, max(lengths) + 1 − start]: which of the entries start..max(lengths) (the anchors'
    scratch index included) row b's K slots read — its committed entries within the context window,
    and its anchor at index lengths[b]. lengths [B] int64 (CPU)."""
    j = torch.arange(start, int(lengths.max()) + 1)[None]
    low = lengths - window if window is not None else torch.zeros_like(lengths)
    mask = (j <= lengths[:, None]) & (j >= low[:, None])
    return mask[:, None, None, :].expand(-1, 1, num_slots, -1)

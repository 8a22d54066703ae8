"""A growable per-layer K/V cache for drafters (committed positions only; rejected ones never enter)."""
from __future__ import annotations

import torch

from flashmap_ext.drafters.common.base import RaggedRows


class KVCache(RaggedRows):
    """Cached context K/V per layer, normed and rotated: buffers [B, G, capacity, hd]; row b's first
    lengths[b] positions (its committed positions so far) are valid, the rest scratch (rows may differ:
    a ragged batch). Capacity doubles when full, so appending is amortised O(new tokens) instead of a
    full copy per round (DynamicCache's torch.cat)."""

    def __init__(self, key_buffers: list[torch.Tensor], value_buffers: list[torch.Tensor], length: int = 0):
        self.key_buffers, self.value_buffers = key_buffers, value_buffers
        #: committed positions per row as Python ints (no device sync; torch.compile sees constants)
        self.rows = [int(length)] * key_buffers[0].shape[0]

    @property
    def keys(self) -> list[torch.Tensor]:
        """Per layer [B, G, length, hd]; row b's positions at and after lengths[b] are scratch."""
        return [k[:, :, :self.length] for k in self.key_buffers]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v[:, :, :self.length] for v in self.value_buffers]

    @classmethod
    def empty(cls, layers: int, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: torch.device | str, capacity: int = 64) -> "KVCache":
        """An empty cache of `layers` layers with room for `capacity` positions before growing."""
        new = lambda: torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)  # noqa: E731
        return cls([new() for _ in range(layers)], [new() for _ in range(layers)])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the entries were made in (the drafter's when it filled them)."""
        return self.key_buffers[0].dtype

    @property
    def batch(self) -> int:
        return self.key_buffers[0].shape[0]

    def append(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """kv: per layer (k, v) [B, G, T, hd] of T new positions of every row, row b's from lengths[b] on."""
        n = kv[0][0].shape[2]
        end = self.length + n
        rows = [(slice(None), self.length)] if not self.ragged else list(enumerate(self.rows))
        for i, (k, v) in enumerate(kv):
            if end > self.key_buffers[i].shape[2]:
                self.key_buffers[i] = _grow(self.key_buffers[i], end)
                self.value_buffers[i] = _grow(self.value_buffers[i], end)
            for b, s in rows:
                self.key_buffers[i][b, :, s:s + n] = k[b]
                self.value_buffers[i][b, :, s:s + n] = v[b]
        self.grow(n)


def _grow(buf: torch.Tensor, needed: int) -> torch.Tensor:
    new = buf.new_zeros(*buf.shape[:2], max(needed, 2 * buf.shape[2]), buf.shape[3])
    new[:, :, :buf.shape[2]] = buf
    return new

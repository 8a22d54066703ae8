"""The target's frozen tensors that drafters read, held by reference and never stored (DESIGN.md §6).

Drafters embed tokens with the target's input embedding E [V, d] and read logits through its LM head.
These live in a plain object (not parameters or buffers): they never enter `state_dict()`, checkpoints,
optimizers or DDP buffer broadcasts, `deepcopy` shares them, and no gradient reaches them.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from flashmap_ext.target.model import hf_causal_lm


class TargetTables:
    """E [V, d] and the LM head (weight [V, d], bias [V] or None), and the same restricted to `rows`.

    rows: None (every row), or [V_s] int64 target ids (a draft vocabulary): `state_embedding` [V_s, d],
    `head_weight` [V_s, d] and `head_bias` are those rows; `full_head_weight` / `full_head_bias` all of them.
    """

    def __init__(self, embedding: torch.Tensor, head_weight: torch.Tensor, head_bias: torch.Tensor | None,
                 rows: torch.Tensor | None = None):
        self.embedding = embedding.detach()
        self.full_head_weight = head_weight.detach()
        self.full_head_bias = None if head_bias is None else head_bias.detach()
        self.rows = None if rows is None else rows.to(self.embedding.device)
        self.state_embedding = self._select(self.embedding)
        self.head_weight = self._select(self.full_head_weight)
        self.head_bias = self._select(self.full_head_bias)
        self._memo: dict = {}

    def _select(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or self.rows is None else t[self.rows.to(t.device)]

    @classmethod
    def from_target(cls, target: Any, rows: torch.Tensor | None = None) -> "TargetTables":
        """The tables of an HF causal LM or an adapter exposing it as `.model`; TypeError unless its LM
        head is an nn.Linear."""
        model = hf_causal_lm(target)
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise TypeError(f"target: the LM head must be an nn.Linear, got {type(head).__name__}")
        return cls(model.get_input_embeddings().weight, head.weight, head.bias, rows)

    def with_rows(self, rows: torch.Tensor | None) -> "TargetTables":
        """The same target tensors restricted to other rows."""
        return TargetTables(self.embedding, self.full_head_weight, self.full_head_bias, rows)

    def __deepcopy__(self, memo: dict) -> "TargetTables":
        return self  # frozen and shared: a copied drafter (e.g. a distillation student) reads the same tables

    @property
    def shape(self) -> tuple[int, int]:
        """(V, d) of E: rows of the padded vocabulary (e.g. 151,936 for Qwen3), hidden size."""
        return tuple(self.embedding.shape)

    def memo(self, key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A value derived from these tables (e.g. a drafter's noise factor), computed once and shared."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """ids [...] int64 target ids -> E[ids] [..., d] in `dtype`."""
        return nn.functional.embedding(ids, self.embedding).to(dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits [..., V_s] over `rows` in the head's dtype."""
        return nn.functional.linear(_dense(hidden, self.head_weight.dtype), self.head_weight, self.head_bias)

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits [..., V] over every row in the head's dtype."""
        return nn.functional.linear(_dense(hidden, self.full_head_weight.dtype), self.full_head_weight,
                                    self.full_head_bias)


def _dense(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`hidden` in `dtype`, contiguous: a strided view (a block's first slots, [B, K, d][:, :k]) sends torch's
    CPU linear to a slow path (for [8, 8, 896] × [8192, 896]ᵀ on one thread of a Xeon with AMX, torch 2.13:
    287 ms against 2.9 ms dense in bf16, 59 ms against 11 ms in fp32), far slower than the copy."""
    return hidden.to(dtype).contiguous()

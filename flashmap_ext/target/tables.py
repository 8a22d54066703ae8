"""The target's frozen tensors a FlashMap drafter reads, held by reference and never stored.

The drafter embeds anchors and labels with the target's input embedding E [V, d], reads slot states
through Eᵀ restricted to the flow's vocabulary, and turns its output into logits with the target's LM
head. These live in a plain object (not parameters or buffers): they never enter `state_dict()`,
checkpoints, optimizers or DDP buffer broadcasts, `deepcopy` shares them, and no gradient reaches them.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flashmap_ext.flow import noise_factor


def hf_causal_lm(target: Any) -> nn.Module:
    """The HF causal LM inside `target` (the model itself, or an adapter exposing it as `.model`)."""
    for obj in (target, getattr(target, "model", None)):
        if obj is not None and hasattr(obj, "get_input_embeddings") and hasattr(obj, "config"):
            return obj
    raise TypeError(f"target: expected a transformers causal LM (or an adapter with `.model`), "
                    f"got {type(target).__name__}")


class TargetTables:
    """E [V, d] (full), and for the flow's rows (all, or the draft vocabulary): E_s [V_s, d],
    the LM head's weight [V_s, d] and bias [V_s] (or None), and the noise factor L with LLᵀ = E_sᵀE_s.

    draft_rows: None, or [V_s] int64 target ids of the draft vocabulary.
    """

    def __init__(self, embedding: torch.Tensor, head_weight: torch.Tensor, head_bias: torch.Tensor | None,
                 draft_rows: torch.Tensor | None = None):
        self.embedding = embedding.detach()
        rows = None if draft_rows is None else draft_rows.to(embedding.device)
        self.state_embedding = self.embedding if rows is None else self.embedding[rows]
        head_weight = head_weight.detach()
        self.head_weight = head_weight if rows is None else head_weight[rows]
        bias = None if head_bias is None else head_bias.detach()
        self.head_bias = bias if bias is None or rows is None else bias[rows]
        self._factor: torch.Tensor | None = None

    @classmethod
    def from_target(cls, target: Any, draft_rows: torch.Tensor | None = None) -> "TargetTables":
        model = hf_causal_lm(target)
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise TypeError(f"target: the LM head must be an nn.Linear, got {type(head).__name__}")
        return cls(model.get_input_embeddings().weight, head.weight, head.bias, draft_rows)

    def __deepcopy__(self, memo: dict) -> "TargetTables":
        return self  # frozen and shared: a copied drafter (e.g. a distillation student) reads the same tables

    @property
    def noise_factor(self) -> torch.Tensor:
        """L [d, d] fp32 on E's device, computed once (fp64 Cholesky of E_sᵀE_s, flow.noise_factor)."""
        if self._factor is None:
            self._factor = noise_factor(self.state_embedding).to(torch.float32)
        return self._factor

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits [..., V_s] in the head's dtype (frozen LM head, draft rows only)."""
        return nn.functional.linear(hidden.to(self.head_weight.dtype), self.head_weight, self.head_bias)

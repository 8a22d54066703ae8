"""The target's frozen embedding table and LM head, shared by drafters without being owned by them.

Drafters (DFlash, EAGLE-3, FlashMap) embed tokens with the target's input embedding and read logits
through the target's LM head. Both stay the target's: they are held by reference in a plain object (not
registered submodules), so `drafter.state_dict()`, `.parameters()` and checkpoints never contain them, and
gradients never flow into them (the weights are used detached).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def hf_model(target: Any) -> nn.Module:
    """The HF causal LM inside `target` (the model itself, or an adapter exposing it as `.model`)."""
    for obj in (target, getattr(target, "model", None)):
        if obj is not None and hasattr(obj, "get_input_embeddings") and hasattr(obj, "config"):
            return obj
    raise TypeError(f"expected a transformers causal LM (or an adapter with `.model`), got {type(target).__name__}")


class TargetParts:
    """References to a target's embedding [V, d] and LM head (d -> V)."""

    def __init__(self, target: Any):
        model = hf_model(target)
        self.embedding: nn.Embedding = model.get_input_embeddings()
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError("the target has no output embeddings (LM head)")
        self.head: nn.Module = head

    @property
    def num_rows(self) -> int:
        """Rows of the embedding table (the padded vocabulary, e.g. 151,936 for Qwen3)."""
        return self.embedding.weight.shape[0]

    @property
    def dim(self) -> int:
        return self.embedding.weight.shape[1]

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """ids [...] int64 -> [..., d] in `dtype` (frozen, no grad into the table)."""
        return F.embedding(ids, self.embedding.weight.detach()).to(dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits [..., V] in the head's dtype (frozen, no grad into the head)."""
        head = self.head
        if isinstance(head, nn.Linear):
            bias = None if head.bias is None else head.bias.detach()
            return F.linear(hidden.to(head.weight.dtype), head.weight.detach(), bias)
        return head(hidden)

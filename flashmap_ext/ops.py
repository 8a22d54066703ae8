"""Typed Python wrappers over torch.ops.flashmap.* and their fake (meta) kernels.

Dimension letters: B batch, K draft length (slots), V vocabulary, d hidden size.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

_verify_op = torch.ops.flashmap.verify.default


class VerifyOutput(NamedTuple):
    tokens: torch.Tensor        # [B, K+1] int64, -1 after the emitted prefix
    num_accepted: torch.Tensor  # [B] int32, accepted drafts (bonus excluded)
    status: torch.Tensor        # [B] int32 bit flags, 0 = clean row


@torch.library.register_fake("flashmap::verify")
def _verify_fake(target_logits, draft_tokens, temperature, top_k, top_p, seed, position,
                 draft_probs, valid_vocab, uniforms):
    B, K1, _ = target_logits.shape
    torch._check(draft_tokens.shape[1] == K1 - 1)
    dev = target_logits.device
    return (target_logits.new_empty((B, K1), dtype=torch.int64),
            torch.empty((B,), dtype=torch.int32, device=dev),
            torch.empty((B,), dtype=torch.int32, device=dev))


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, *, temperature=0.0, top_k=0,
           top_p=1.0, seed=0, position=0, draft_probs: Optional[torch.Tensor] = None,
           valid_vocab: Optional[int] = None, uniforms: Optional[torch.Tensor] = None,
           check: bool = True) -> VerifyOutput:
    """Placeholder signature; the full docstring and argument normalisation land with issue 2."""
    raise NotImplementedError

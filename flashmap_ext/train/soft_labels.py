"""Soft labels: the target's top-k next-token log-probabilities, and a forward-KL loss on them (DESIGN.md §8).

Stored per position j by `flashmap features --topk K` (train/features.py): the K largest log-probabilities of
the target's next-token distribution at j (log_softmax in fp32 over the whole vocabulary), their target ids,
and the log-mass of the rest of the vocabulary, so that Σ exp(top) + exp(rest) = 1. Position j's
distribution is the label distribution of the token at j + 1 (`train.anchors.block_soft_labels`).

A drafter proposes from V_d draft-vocabulary rows. The loss coarsens both distributions to the same bins:
every top-k id inside the draft vocabulary is its own bin, and one "rest" bin holds everything else (for the
target: the rest of the vocabulary plus the top-k ids outside the draft vocabulary — their mass is kept, not
renormalised away; for the drafter: its rows that are not kept top-k ids). Per slot

    loss = KL(p_bins ‖ q_bins) + ce_weight · CE(q, argmax of p)

where the argmax is the target's top-1 id (unsupervised when it lies outside the draft vocabulary). A rest
bin the drafter cannot put mass on (every row kept) is left out of the KL: nothing can move it.
"""
from __future__ import annotations

from typing import Callable

import torch

IGNORE = -100
SOFT_KEYS = ("soft_logp", "soft_ids")
LOSSES = ("ce", "kl")


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [..., k + 1] fp32: the k largest log-probabilities then the rest's log-mass, ids [..., k] int64)
    of softmax(logits) over its last dim (computed in fp32). ValueError unless 1 <= k < logits.shape[-1]."""
    v = logits.shape[-1]
    if not 1 <= k < v:
        raise ValueError(f"topk: expected 1 <= k < vocabulary size {v}, got {k}")
    logp = torch.log_softmax(logits.float(), -1)
    top, ids = logp.topk(k, -1)
    rest = logp.scatter(-1, ids, float("-inf")).logsumexp(-1, keepdim=True)
    return torch.cat([top, rest], -1), ids


def draft_bins(soft_logp: torch.Tensor, soft_ids: torch.Tensor,
               to_rows: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's distribution on the drafter's bins (module docstring).

    soft_logp [..., k + 1] (any float dtype), soft_ids [..., k] int64 target ids (−1 = no label);
    to_rows maps target ids to draft rows (−100 outside the draft vocabulary; e.g. `DraftVocab.to_draft`).
    Returns (rows [..., k] int64, −100 where not a bin; logp [..., k] fp32, −inf where not a bin;
    rest [...] fp32: log of the rest bin's mass).
    """
    logp = soft_logp.float()
    top, rest = logp[..., :-1], logp[..., -1]
    rows = to_rows(soft_ids.clamp_min(0))
    kept = (rows >= 0) & (soft_ids >= 0)
    dropped = top.masked_fill(kept, float("-inf")).logsumexp(-1)
    return torch.where(kept, rows, IGNORE), top.masked_fill(~kept, float("-inf")), torch.logaddexp(rest, dropped)


def binned_kl(logits: torch.Tensor, rows: torch.Tensor, logp: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """KL(p_bins ‖ q_bins) [...] fp32, q = softmax(logits [..., V_d]); rows/logp/rest from `draft_bins`."""
    logq = torch.log_softmax(logits.float(), -1)
    v = logq.shape[-1]
    kept = rows >= 0
    logq_k = logq.gather(-1, rows.clamp_min(0))
    in_bin = torch.zeros(*logq.shape[:-1], v + 1, dtype=torch.bool, device=logq.device)
    in_bin.scatter_(-1, torch.where(kept, rows, v), True)  # column v collects the non-bins
    logq_rest = logq.masked_fill(in_bin[..., :v], float("-inf")).logsumexp(-1)
    p_k = logp.exp()
    term_k = torch.where(kept & (p_k > 0), p_k * (logp - logq_k), 0.0).sum(-1)
    p_rest = rest.exp()
    use_rest = (p_rest > 0) & torch.isfinite(logq_rest)
    return term_k + torch.where(use_rest, p_rest * (rest - logq_rest), 0.0)


def soft_slot_loss(logits: torch.Tensor, soft_logp: torch.Tensor, soft_ids: torch.Tensor,
                   to_rows: Callable[[torch.Tensor], torch.Tensor], ce_weight: float) -> torch.Tensor:
    """Per-slot KL + ce_weight · CE(target argmax) [...] fp32 for draft logits [..., V_d] (module docstring).
    Slots whose labels are masked must be masked by the caller (their value is finite but meaningless)."""
    rows, logp, rest = draft_bins(soft_logp, soft_ids, to_rows)
    loss = binned_kl(logits, rows, logp, rest)
    if ce_weight:
        top1 = to_rows(soft_ids[..., 0].clamp_min(0))
        ok = (top1 >= 0) & (soft_ids[..., 0] >= 0)
        logq = torch.log_softmax(logits.float(), -1).gather(-1, top1.clamp_min(0)[..., None])[..., 0]
        loss = loss + ce_weight * torch.where(ok, -logq, 0.0)
    return loss


def require_soft_labels(batch: dict, option: str = "--loss kl") -> None:
    """ValueError (one line) when the batch carries no soft labels: its feature cache has no logits."""
    if any(key not in batch for key in SOFT_KEYS):
        raise ValueError(f"{option}: the feature cache holds no target logits (soft labels); rebuild it with "
                         "`flashmap features --topk 32`, or train with --loss ce")


def check_cache(meta: dict, path: str, loss: str) -> None:
    """Before training: ValueError (one line) for --loss kl on a cache written without --topk, or an
    unknown --loss."""
    if loss not in LOSSES:
        raise ValueError(f"--loss must be one of {LOSSES} (got {loss!r})")
    if loss == "kl" and not meta.get("topk"):
        raise ValueError(f"--loss kl: the feature cache {path} holds no target logits (made without --topk); "
                         "rebuild it with `flashmap features --topk 32`, or train with --loss ce")

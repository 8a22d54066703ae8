"""Pure-PyTorch references of the flashmap ops: the test oracles (clarity over speed).

Each op's section is self-contained. Kernels name their reference in their header comment.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from flashmap_ext.ops.status import (
    STATUS_BAD_DRAFT_PROB,
    STATUS_BAD_PARAMS,
    STATUS_ERRORS,
    STATUS_FALLBACK,
    STATUS_NO_FINITE,
    STATUS_NONFINITE,
)
from flashmap_ext.rng import STREAM_ACCEPT, STREAM_RESAMPLE, verify_uniform

# ---------------------------------------------------------------------------------------------------
# verify — fused acceptance step (DESIGN.md §3.1). Kernels: csrc/verify/verify_cpu.cpp,
# csrc/verify/verify_kernel.cu. Rejection sampling after Leviathan et al. 2023 ("Fast Inference from
# Transformers via Speculative Decoding", arXiv:2211.17192) and Chen et al. 2023 ("Accelerating Large
# Language Model Decoding with Speculative Sampling", arXiv:2302.01318).
# ---------------------------------------------------------------------------------------------------

def verify_target_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                        valid_vocab: int) -> torch.Tensor:
    """Filtered target distribution p of one slot, float64 [V].

    Order: ids >= valid_vocab masked; z = (l - max) / T; top-k keeps every id whose logit is >= the
    k-th largest (ties at the threshold kept; k <= 0 or k >= valid_vocab is off); softmax; top-p keeps id
    j iff the mass of ids strictly more probable than j is < top_p (the smallest nucleus reaching top_p,
    ties kept; top_p >= 1 is off; the most probable ids are always kept); renormalise.
    Requires temperature > 0 and at least one finite logit.
    """
    return verify_target_probs_margin(logits, temperature, top_k, top_p, valid_vocab)[0]


def verify_target_probs_margin(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                               valid_vocab: int) -> tuple[torch.Tensor, float]:
    """`verify_target_probs` and how fragile its top-p cut is: the distance of top_p to the nearest
    nucleus mass on either side of the cut (inf when top-p is off). An fp32 kernel may cut elsewhere
    when this is within its rounding (DESIGN.md §3.1, CPU vs CUDA)."""
    l = logits.double().clone()
    l[valid_vocab:] = -math.inf
    if 0 < top_k < valid_vocab:
        kth = torch.sort(l[:valid_vocab], descending=True).values[top_k - 1]
        l[l < kth] = -math.inf
    z = (l - l.max()) / temperature
    p = torch.exp(z)
    p /= p.sum()
    margin = math.inf
    if top_p < 1.0:
        ps = torch.sort(p, descending=True).values
        above = torch.cumsum(ps, 0) - ps        # mass before each sorted entry; nondecreasing
        kept = max(int((above < top_p).sum()), 1)  # a prefix; the first of a tie group has the least
        # The cut falls between tie groups: the last kept group's first entry (mass before it < top_p)
        # and the next group's first entry (mass before it >= top_p); only those masses decide.
        first = int(torch.searchsorted(-ps, -ps[kept - 1:kept]))  # first entry of the last kept group
        after = int(torch.searchsorted(-ps, -ps[kept - 1:kept], right=True))  # next group's first entry
        margin = top_p - float(above[first]) if first > 0 else math.inf
        if after < ps.numel():
            margin = min(margin, float(above[after]) - top_p)
        p = torch.where(p >= ps[kept - 1], p, torch.zeros_like(p))  # extend to ties at the threshold
        p /= p.sum()
    return p, margin


def _inverse_cdf(weights: torch.Tensor, u: float) -> tuple[int, float]:
    """Smallest id j with cumsum(weights)[j] > u * sum(weights) (fp64), and the relative distance of
    u * sum to the nearest cumsum boundary (how fragile the choice is to rounding)."""
    total = float(weights.sum())
    cum = torch.cumsum(weights, 0)
    target = u * total
    j = int(torch.searchsorted(cum, torch.tensor([target], dtype=cum.dtype), right=True)[0])
    j = min(j, weights.numel() - 1)
    while weights[j] <= 0 and j > 0:  # guard against rounding past the last positive weight
        j -= 1
    lo = float(cum[j - 1]) if j > 0 else 0.0
    margin = min(abs(target - lo), abs(float(cum[j]) - target)) / total
    return j, margin


def _row_status(logits: torch.Tensor, valid_vocab: int) -> int:
    """Status bits of one batch row: logits [K+1, V]."""
    valid = logits[:, :valid_vocab].double()
    status = 0
    if bool((torch.isnan(valid) | (valid == math.inf)).any()):
        status |= STATUS_NONFINITE
    if bool((~torch.isfinite(valid)).all(dim=1).any()):
        status |= STATUS_NO_FINITE
    return status


def _row_input_status(drafts, temperature, top_k, top_p, draft_probs, valid_vocab: int) -> int:
    """Status bits of one batch row that do not come from its logits (csrc/verify/verify_core.h::
    verify_input_status): sampling parameters outside their domain; a sampling row whose q(x) at an
    in-range draft of slot i < K is not in (0, 1] (x was sampled from q, so q(x) > 0). Only q(x) is
    checked; greedy rows never read draft_probs."""
    status = 0
    if not 0.0 <= temperature < math.inf or not 0.0 <= top_p <= 1.0 or top_k < 0:
        status |= STATUS_BAD_PARAMS
    if draft_probs is not None and temperature > 0:
        for i, x in enumerate(drafts):
            if 0 <= x < valid_vocab and not 0.0 < float(draft_probs[i, x]) <= 1.0:
                status |= STATUS_BAD_DRAFT_PROB
    return status


def _sample_emission(p: torch.Tensor, q: Optional[torch.Tensor], x: int, u: float) -> tuple[int, float, int]:
    """Token emitted at a rejected slot: sample ∝ max(p - q, 0) (q None: p with x removed; x < 0: no
    draft, plain p). Returns (token, margin, status bits)."""
    if x < 0:
        residual = p.clone()
    elif q is None:
        residual = p.clone()
        residual[x] = 0.0
    else:  # a NaN in q weighs 0, as in the kernels' `r > 0 ? r : 0`
        residual = p - q.double()
        residual = torch.where(residual > 0, residual, torch.zeros_like(residual))
    status = 0
    if float(residual.sum()) <= 0.0:  # degenerate residual: fall back to p minus x, then to p
        status = STATUS_FALLBACK
        residual = p.clone()
        if x >= 0 and float(residual.sum() - residual[x]) > 0:
            residual[x] = 0.0
    token, margin = _inverse_cdf(residual, u)
    return token, margin, status


def verify_reference_row(logits, drafts, temperature, top_k, top_p, seed, position, draft_probs,
                         valid_vocab, uniforms):
    """One batch row of `verify`. logits [K+1, V], drafts [K] (python ints), draft_probs [K, V] or None,
    uniforms [K+1] or None. Returns (tokens list [K+1], num_accepted, status, margin): margin is the
    smallest distance of a decisive coin, or of a top-p cut, to its threshold (inf for greedy rows)."""
    K = len(drafts)
    tokens = [-1] * (K + 1)
    status = _row_status(logits, valid_vocab) | _row_input_status(drafts, temperature, top_k, top_p,
                                                                    draft_probs, valid_vocab)
    if status & STATUS_ERRORS:
        tokens[0] = 0  # deterministic in-range token; the wrapper raises for such rows
        return tokens, 0, status, math.inf
    greedy = not temperature > 0
    margin = math.inf
    for i in range(K + 1):
        x = drafts[i] if i < K else -1
        x = x if 0 <= x < valid_vocab else -1  # -1, negative or out-of-range ids are "no draft"
        if greedy:
            best = int(torch.argmax(logits[i, :valid_vocab].double()))  # lowest index wins ties
            if i < K and x == best:
                tokens[i] = x
                continue
            tokens[i] = best
            return tokens, i, status, margin
        p, cut_margin = verify_target_probs_margin(logits[i], temperature, top_k, top_p, valid_vocab)
        margin = min(margin, cut_margin)
        q = None if draft_probs is None or i == K else draft_probs[i]
        if i < K and x >= 0:
            u = float(uniforms[i]) if uniforms is not None else verify_uniform(seed, position + i, STREAM_ACCEPT)
            qx = 1.0 if q is None else float(q[x])
            margin = min(margin, abs(u * qx - float(p[x])))
            if u * qx < float(p[x]):  # accept; u in [0, 1) so p(x) = 0 is never accepted
                tokens[i] = x
                continue
        u = float(uniforms[K]) if uniforms is not None else verify_uniform(seed, position + i, STREAM_RESAMPLE)
        tokens[i], m, s = _sample_emission(p, q, x, u)
        return tokens, i, status | s, min(margin, m)
    raise AssertionError("unreachable")


def verify_reference_detailed(target_logits, draft_tokens, temperature, top_k, top_p, seed, position,
                              draft_probs=None, valid_vocab=None, uniforms=None):
    """`verify_reference` plus margin [B] float64 (see verify_reference_row)."""
    B, K1, V = target_logits.shape
    vv = V if valid_vocab is None or valid_vocab <= 0 else min(int(valid_vocab), V)
    tokens = torch.full((B, K1), -1, dtype=torch.int64)
    num_accepted = torch.zeros(B, dtype=torch.int32)
    status = torch.zeros(B, dtype=torch.int32)
    margin = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        row = verify_reference_row(
            target_logits[b].cpu(), draft_tokens[b].tolist(), float(temperature[b]), int(top_k[b]),
            float(top_p[b]), int(seed[b]), int(position[b]),
            None if draft_probs is None else draft_probs[b].cpu(), vv,
            None if uniforms is None else uniforms[b].cpu().double())
        tokens[b] = torch.tensor(row[0])
        num_accepted[b], status[b], margin[b] = row[1], row[2], row[3]
    dev = target_logits.device
    return tokens.to(dev), num_accepted.to(dev), status.to(dev), margin


def verify_reference(target_logits, draft_tokens, temperature, top_k, top_p, seed, position,
                     draft_probs=None, valid_vocab=None, uniforms=None):
    """Float64 loop-level reference of `flashmap::verify` (same arguments as the op schema).

    Args: target_logits [B, K+1, V] any float dtype; draft_tokens [B, K] int64; temperature, top_p [B]
    float; top_k [B] int; seed, position [B] int64; draft_probs [B, K, V] or None; valid_vocab int
    (<= 0 or None: V); uniforms [B, K+1] or None (K accept coins, then one resample coin).
    Returns: tokens [B, K+1] int64 (-1 after the emitted prefix), num_accepted [B] int32, status [B] int32.
    """
    return verify_reference_detailed(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                     position, draft_probs, valid_vocab, uniforms)[:3]

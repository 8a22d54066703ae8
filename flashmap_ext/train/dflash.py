"""DFlash training loss (DESIGN.md §8 `train dflash`, §11).

Per block: cross-entropy of slots k = 1 … block_size−1 (slot k predicts the token at anchor+k) with
weights w_k = exp(−(k−1)/γ), γ = 7 for block 16 (5 for 10, 4 for 8: DFlash paper Eq. 4 / App. A.3.1,
SpecForge `--loss-decay-gamma` help); loss = Σ w·CE / Σ w over unmasked labels (SpecForge
`OnlineDFlashModel.forward`). With `loss="kl"` the per-slot CE becomes forward KL to the target's stored
distribution plus `ce_weight`·CE on its argmax (train/soft_labels.py). LM-head logits are computed a chunk of anchors at a time under activation
checkpointing, so [B, A, K, V] logits never exist at once (A = 512, V = 151,936 would be ~5 GB).

DFlash2 (a drafter with a `candidate_selector`) adds its selector loss on the same hidden states and logits,
with the same slot weights: `selector_weight` · Σ w·CE_k / Σ w, CE_k over slot k's top-k unary candidates
re-scored given the true previous token (the anchor for slot 1), the label put in place of the last
candidate when the top-k misses it (speculators' `selector_training_candidates`, its loss weight 1.0).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.train.soft_labels import SOFT_KEYS, require_soft_labels, soft_slot_loss

IGNORE = -100
_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """DFlash's decay γ for the published block sizes; otherwise 7·(block_size−1)/15 (our
    extrapolation: the same decay per fraction of the block as γ = 7 at block 16)."""
    return _GAMMA.get(block_size, 7.0 * (block_size - 1) / 15.0)


def slot_weights(num_slots: int, gamma: float, device=None) -> torch.Tensor:
    """[num_slots] fp32: w_k = exp(−(k−1)/γ) for k = 1 … num_slots."""
    return torch.exp(-torch.arange(num_slots, dtype=torch.float32, device=device) / gamma)


def reachable_slots(correct: torch.Tensor) -> torch.Tensor:
    """correct [..., K] bool (draft slot right) -> [..., K] bool: every earlier slot right, so verification
    gets to slot k (slot 1 always)."""
    right = correct.long().cumprod(-1).bool()
    return torch.cat([torch.ones_like(right[..., :1]), right[..., :-1]], -1)


def _slot_ce(drafter: DFlashDrafter, hidden: torch.Tensor, labels: torch.Tensor, prev: torch.Tensor | None,
             *soft: torch.Tensor, ce_weight: float = 0.0):
    """hidden [B, a, K, d], labels [B, a, K] -> (loss [B, a, K] fp32, 0 where masked; correct [B, a, K] bool;
    selector loss [B, a, K] or None). Loss: CE of the labels, or with `soft` = (soft_logp, soft_ids) KL +
    ce_weight·CE (soft_labels.py). prev [B, a, K]: each slot's true previous row, for a DFlash2 selector
    (None: no selector; `correct` is then the unary argmax's, else the selector's teacher-forced choice)."""
    logits = drafter.vocab_logits(hidden).float()
    if soft:
        loss = soft_slot_loss(logits, *soft, drafter.to_draft_ids, ce_weight) * (soft[1][..., 0] >= 0)
    else:
        loss = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE,
                               reduction="none").view_as(labels)
    if prev is None:
        return loss, logits.argmax(-1) == labels, None
    sel_loss, choice = selector_ce(drafter.candidate_selector, logits, hidden, prev, labels)
    return loss, choice == labels, sel_loss


def selector_ce(selector, logits: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE [..] fp32 of the label among the re-scored top-k candidates, 0 where labels == IGNORE; the
    selector's teacher-forced choice [..] rows). A label outside the top-k replaces its last candidate."""
    cands = selector.candidates(logits.detach())
    hit = cands == labels.unsqueeze(-1)
    found = hit.any(-1)
    cands = cands.clone()
    cands[..., -1] = torch.where(found | (labels < 0), cands[..., -1], labels)
    where = torch.where(found, hit.long().argmax(-1), cands.shape[-1] - 1)
    scores = selector.edge_scores(logits, hidden, prev, cands).float()
    ce = F.cross_entropy(scores.flatten(0, -2), torch.where(labels < 0, IGNORE, where).flatten(),
                         ignore_index=IGNORE, reduction="none").view_as(labels)
    choice = cands.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
    return ce, torch.where(found, choice, IGNORE - 1)


def _check_batch(batch: dict, num_slots: int) -> None:
    for key in ("input_ids", "taps", "anchor_pos", "labels"):
        if key not in batch:
            raise KeyError(f"batch has no {key!r} (expected input_ids, taps, anchor_pos, labels)")
    labels, anchors = batch["labels"], batch["anchor_pos"]
    if labels.dim() != 3 or labels.shape[:2] != anchors.shape or labels.dtype != torch.long:
        raise ValueError(f"labels must be [B, A, K] int64 matching anchor_pos {tuple(anchors.shape)}, "
                         f"got {tuple(labels.shape)} {labels.dtype}")
    if labels.shape[2] < num_slots:
        raise ValueError(f"labels hold K={labels.shape[2]} tokens per anchor; block_size−1 = {num_slots} needed")


def dflash_loss(model: torch.nn.Module, batch: dict, generator: torch.Generator | None = None, *,
                gamma: float | None = None, anchor_chunk: int = 64, loss: str = "ce",
                ce_weight: float = 0.0, selector_weight: float = 1.0,
                reachable: bool = False) -> tuple[torch.Tensor, dict]:
    """Weighted block CE of a DFlash (or DFlash2: plus `selector_weight` × its selector loss) drafter on one
    batch.

    model: a `DFlashDrafter`, or it wrapped by DDP/FSDP (called through `model(...)` so the wrapper's
    hooks run; the unwrapped module supplies the config and the target's frozen head).
    batch: `input_ids` [B, T] int64, `taps` [B, T, n_taps·d], `anchor_pos` [B, A] int64 (−1 = padded
    block), `labels` [B, A, K] int64 = tokens at anchor+1 … anchor+K, −100 masked; K ≥ block_size−1
    (the first block_size−1 are used). `generator` is unused (anchors come with the batch).
    gamma: slot decay of w_k = exp(−(k−1)/γ) (None: `default_gamma(block_size)`; `train dflash --slot-decay`).
    loss: "ce" (labels) or "kl" (needs the batch's soft_logp/soft_ids, else ValueError: forward KL to the
    target's distribution + ce_weight·CE on its argmax, per slot).
    reachable: the block loss only at the slots verification reaches, those whose draft prefix (the argmax,
    DFlash2: the selector's choice) is right (`reachable_slots`); the selector loss keeps every slot.
    Returns (scalar loss with grad, metrics {loss, acc, accept_len, tokens} as floats; DFlash2 adds
    selector_loss): `acc` is top-1 accuracy over unmasked slots (DFlash2: of the selector's teacher-forced
    choice, counted wrong when the label is outside the unary top-k); `accept_len` = 1 + mean leading run of
    correct slots per block whose first label is unmasked (a greedy acceptance-length estimate, bonus included).
    """
    del generator
    drafter: DFlashDrafter = getattr(model, "module", model)
    k = drafter.num_draft_tokens
    _check_batch(batch, k)
    device = drafter.tables.embedding.device
    if loss == "kl":
        require_soft_labels(batch)
    keys = ("input_ids", "taps", "anchor_pos", "labels") + (SOFT_KEYS if loss == "kl" else ())
    b = {key: batch[key].to(device) for key in keys}
    labels = drafter.to_draft_ids(b["labels"][:, :, :k])  # draft-vocabulary rows (identity without one)
    soft = [b[key][:, :, :k] for key in SOFT_KEYS] if loss == "kl" else []
    hidden = model(b["taps"], b["input_ids"], b["anchor_pos"])
    prev = _previous_rows(drafter, b["input_ids"], b["anchor_pos"], labels)
    ces, hits, sels = [], [], []
    fn = functools.partial(_slot_ce, ce_weight=ce_weight)
    for s in range(0, labels.shape[1], anchor_chunk):
        args = (drafter, hidden[:, s:s + anchor_chunk], labels[:, s:s + anchor_chunk],
                None if prev is None else prev[:, s:s + anchor_chunk], *(x[:, s:s + anchor_chunk] for x in soft))
        ce, hit, sel = checkpoint(fn, *args, use_reentrant=False) if torch.is_grad_enabled() else fn(*args)
        ces.append(ce), hits.append(hit), sels.append(sel)
    ce, hit = torch.cat(ces, 1), torch.cat(hits, 1)
    valid = labels != IGNORE
    weighted = soft[1][..., 0] >= 0 if soft else valid  # KL: every labelled slot, in the draft vocab or not
    if reachable:
        weighted = weighted & reachable_slots(hit)
    decay = default_gamma(drafter.config.block_size) if gamma is None else gamma
    w = slot_weights(k, decay, device) * weighted
    total = (ce * w).sum() / w.sum().clamp_min(1e-6)
    if prev is None:
        return total, _metrics(total, hit & valid, valid)
    ws = slot_weights(k, decay, device) * valid
    sel = (torch.cat(sels, 1) * ws).sum() / ws.sum().clamp_min(1e-6)
    total = total + selector_weight * sel
    return total, {**_metrics(total, hit & valid, valid), "selector_loss": sel.item()}


def _previous_rows(drafter, input_ids: torch.Tensor, anchor_pos: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None:
    """[B, A, K] draft rows of each slot's true previous token (slot 1: the anchor's; IGNORE outside the
    draft vocabulary or masked), for a drafter with a candidate selector; None for one without."""
    if not hasattr(drafter, "candidate_selector"):
        return None
    anchor = drafter.to_draft_ids(input_ids.gather(1, anchor_pos.clamp_min(0)))
    return torch.cat([anchor.unsqueeze(-1), labels[..., :-1]], -1)


@torch.no_grad()
def _metrics(loss: torch.Tensor, correct: torch.Tensor, valid: torch.Tensor) -> dict:
    n = valid.sum().item()
    run = correct.long().cumprod(-1).sum(-1).float()           # leading correct slots per block
    scored = valid[..., 0]
    return {"loss": loss.item(), "acc": correct.sum().item() / n if n else math.nan,
            "accept_len": 1.0 + run[scored].mean().item() if scored.any() else math.nan, "tokens": n}

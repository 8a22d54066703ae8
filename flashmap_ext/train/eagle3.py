"""EAGLE-3 training: training-time-test loss and the draft vocabulary (DESIGN.md §8 `train eagle3`).

Loss (arXiv:2503.01840; SafeAILab/EAGLE `traineagle3/main.py`, SpecForge `train_eagle3.py`): the drafter
unrolls `steps` = 7 drafting steps from each anchor feeding its own hidden states, and
loss = Σ_j 0.8^j · mean CE_j over the supervised labels of step j. Step j predicts labels[..., j], the
token at anchor+1+j. Labels outside the draft vocabulary are not supervised (EAGLE-3's `position_mask`).
Difference from EAGLE-3: by default targets are the data tokens (hard CE), not the target's soft
distribution; with target-regenerated greedy data these are the target's argmax tokens. `loss="kl"` trains on
the target's stored distribution instead (forward KL + ce_weight·CE on its argmax, train/soft_labels.py). The batch is the one every drafter
loss consumes (`flashmap_ext.train.anchors`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.train.soft_labels import SOFT_KEYS, require_soft_labels, soft_slot_loss

IGNORE = -100


def build_draft_vocab(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent target ids (ties: lower id first), ascending, as EAGLE-3 builds d2t.

    token_counts: [V] counts of each target id in the training responses. Returns [size] int64.
    """
    counts = torch.as_tensor(token_counts, dtype=torch.float64).flatten()
    if not 1 <= size <= counts.numel():
        raise ValueError(f"size must be in [1, {counts.numel()}], got {size}")
    order = torch.argsort(-counts, stable=True)
    return order[:size].sort().values


def count_tokens(sequences, vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of the ids in an iterable of int64 tensors (e.g. the supervised response tokens)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        counts += torch.bincount(torch.as_tensor(ids).flatten().cpu(), minlength=vocab_size)[:vocab_size]
    return counts


def eagle3_loss(model: torch.nn.Module, batch: dict, generator: torch.Generator | None = None, *,
                steps: int = 7, decay: float = 0.8, loss: str = "ce", ce_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Training-time-test loss of an EAGLE-3 drafter on one batch.

    model: an `Eagle3Drafter` (or it wrapped by DDP/FSDP: called as `model(...)`). batch: `input_ids`
    [B, T] int64, `taps` [B, T, n_taps·d], `anchor_pos` [B, A] int64 (−1 padded), `labels` [B, A, K] int64
    (tokens at anchor+1 …, −100 masked), K ≥ steps. Anchors at 0 have no context pair and are skipped.
    loss: "ce", or "kl" (the batch's soft_logp/soft_ids, else ValueError; module docstring).
    Returns (scalar loss with grad, metrics {loss, acc (step-0 top-1), accept_len, tokens} as floats);
    `accept_len` = 1 + mean leading run of correct teacher-forced steps per scored block (bonus included).
    """
    del generator
    drafter: Eagle3Drafter = getattr(model, "module", model)
    labels = batch["labels"]
    if labels.dim() != 3 or labels.shape[:2] != batch["anchor_pos"].shape or labels.shape[2] < steps:
        raise ValueError(f"labels must be [B, A, K>={steps}] matching anchor_pos, got {tuple(labels.shape)}")
    device = drafter.tables.embedding.device
    if loss == "kl":
        require_soft_labels(batch)
    keys = ("input_ids", "taps", "anchor_pos", "labels") + (SOFT_KEYS if loss == "kl" else ())
    b = {k: batch[k].to(device) for k in keys}
    labels = b["labels"][..., :steps]
    labels = torch.where(b["anchor_pos"][..., None] >= 1, labels, IGNORE)
    rows = drafter.target_to_draft(labels)  # IGNORE stays IGNORE
    logits = model(b["taps"], b["input_ids"], b["anchor_pos"], steps=steps).float()
    if loss == "kl":
        soft_ids = b["soft_ids"][:, :, :steps]
        ce = soft_slot_loss(logits, b["soft_logp"][:, :, :steps], soft_ids, drafter.target_to_draft, ce_weight)
        supervised = (soft_ids[..., 0] >= 0) & (labels != IGNORE)
    else:
        ce = F.cross_entropy(logits.flatten(0, -2), rows.clamp(min=0).flatten(), reduction="none").view_as(rows)
        supervised = rows >= 0
    per_step = (ce * supervised).sum((0, 1)) / supervised.sum((0, 1)).clamp_min(1)
    total = (per_step * decay ** torch.arange(steps, device=device)).sum()
    with torch.no_grad():
        correct = (drafter.draft_ids[logits.argmax(-1)] == labels) & (labels != IGNORE)
    return total, _metrics(total, correct, labels != IGNORE, supervised)


@torch.no_grad()
def _metrics(loss, correct, labelled, supervised) -> dict:
    n0 = supervised[..., 0].sum().item()
    scored = labelled[..., 0]
    run = correct.long().cumprod(-1).sum(-1).float()
    return {"loss": loss.item(), "acc": (correct[..., 0] & supervised[..., 0]).sum().item() / n0 if n0 else math.nan,
            "accept_len": 1.0 + run[scored].mean().item() if scored.any() else math.nan,
            "tokens": supervised.sum().item()}

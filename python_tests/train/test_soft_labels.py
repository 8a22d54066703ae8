"""Soft labels (train/soft_labels.py): top-k bookkeeping, draft-vocabulary bins and the KL loss, each against a
float64 loop written from the definition (module docstring), not from the code under test."""
import math

import pytest
import torch

from flashmap_ext.drafters.common.vocab import DraftVocab
from flashmap_ext.train.soft_labels import binned_kl, draft_bins, require_soft_labels, soft_slot_loss, topk_logprobs


def ref_bins(p: list[float], top: list[int], draft_ids: list[int] | None):
    """float64 loop: {draft row: mass} for the top ids inside the draft vocabulary, and the rest's mass."""
    rows = {t: r for r, t in enumerate(draft_ids)} if draft_ids is not None else {t: t for t in range(len(p))}
    bins = {rows[t]: p[t] for t in top if t in rows}
    return bins, 1.0 - sum(bins.values())


def ref_kl(p: list[float], top: list[int], draft_ids, logits: list[float]) -> float:
    """KL(p_bins || q_bins) in float64 with q = softmax(logits) over the draft rows."""
    bins, rest = ref_bins(p, top, draft_ids)
    m = max(logits)
    z = sum(math.exp(x - m) for x in logits)
    q = [math.exp(x - m) / z for x in logits]
    q_rest = sum(qi for r, qi in enumerate(q) if r not in bins)
    kl = sum(pb * math.log(pb / q[r]) for r, pb in bins.items() if pb > 0)
    return kl + (rest * math.log(rest / q_rest) if rest > 0 and q_rest > 0 else 0.0)


def test_topk_logprobs_match_a_float64_softmax():
    logits = torch.randn(3, 40, dtype=torch.float64) * 4
    logp, ids = topk_logprobs(logits.float(), 6)
    ref = torch.log_softmax(logits, -1)
    for row in range(3):
        order = sorted(range(40), key=lambda v: -ref[row, v].item())
        assert ids[row].tolist() == order[:6]
        torch.testing.assert_close(logp[row, :6].double(), ref[row, order[:6]], atol=1e-5, rtol=0)
        rest = math.log(sum(math.exp(ref[row, v].item()) for v in order[6:]))
        assert abs(logp[row, 6].item() - rest) < 1e-5
        assert abs(logp[row].double().exp().sum().item() - 1.0) < 1e-5  # top-k mass + rest = 1
    with pytest.raises(ValueError, match="topk"):
        topk_logprobs(logits, 40)


def test_draft_bins_keep_the_mass_of_ids_outside_the_draft_vocabulary():
    p = torch.softmax(torch.randn(20, dtype=torch.float64) * 2, -1)
    logp, ids = topk_logprobs(p.log().float(), 7)
    draft_ids = [0, 3, 4, 7, 9, 11, 15, 19]
    vocab = DraftVocab(DraftVocab.offsets(torch.tensor(draft_ids), len(draft_ids)))
    rows, blogp, rest = draft_bins(logp, ids, vocab.to_draft)
    bins, want_rest = ref_bins(p.tolist(), ids.tolist(), draft_ids)
    got = {int(r): math.exp(float(x)) for r, x in zip(rows, blogp) if r >= 0}
    assert got.keys() == bins.keys() and all(abs(got[r] - bins[r]) < 1e-6 for r in bins)
    assert all(math.isinf(float(x)) for r, x in zip(rows, blogp) if r < 0)
    assert abs(math.exp(float(rest)) - want_rest) < 1e-6
    no_label = draft_bins(logp, torch.full_like(ids, -1), vocab.to_draft)
    assert (no_label[0] == -100).all() and abs(float(no_label[2].exp()) - 1.0) < 1e-6


@pytest.mark.parametrize("with_vocab", [False, True])
def test_binned_kl_matches_float64_loop(with_vocab):
    g = torch.Generator().manual_seed(3)
    v, k = 30, 5
    p = torch.softmax(torch.randn(4, v, generator=g, dtype=torch.float64) * 2, -1)
    draft_ids = sorted(torch.randperm(v, generator=g)[:12].tolist()) if with_vocab else None
    vocab = DraftVocab(DraftVocab.offsets(torch.tensor(draft_ids), 12) if with_vocab else None)
    logits = torch.randn(4, 12 if with_vocab else v, generator=g, dtype=torch.float64)
    logp, ids = topk_logprobs(p.log().float(), k)
    kl = binned_kl(logits.float(), *draft_bins(logp, ids, vocab.to_draft))
    for row in range(4):
        want = ref_kl(p[row].tolist(), ids[row].tolist(), draft_ids, logits[row].tolist())
        assert abs(kl[row].item() - want) < 1e-5, (row, kl[row].item(), want)


def test_binned_kl_is_the_exact_kl_when_the_bins_are_the_vocabulary():
    p = torch.softmax(torch.randn(16, dtype=torch.float64), -1)
    logits = torch.randn(16, dtype=torch.float64)
    q = torch.softmax(logits, -1)
    exact = float((p * (p.log() - q.log())).sum())
    logp, ids = topk_logprobs(p.log().float(), 15)  # 15 ids + the rest = all 16 tokens
    got = binned_kl(logits.float(), *draft_bins(logp, ids, DraftVocab(None).to_draft))
    assert abs(float(got) - exact) < 1e-5
    same = binned_kl(p.log().float(), *draft_bins(logp, ids, DraftVocab(None).to_draft))
    assert abs(float(same)) < 1e-5  # q = p: zero


def test_soft_slot_loss_adds_weighted_ce_on_the_target_argmax():
    p = torch.softmax(torch.randn(2, 10, dtype=torch.float64) * 3, -1)
    logits = torch.randn(2, 10)
    logp, ids = topk_logprobs(p.log().float(), 4)
    to_rows = DraftVocab(None).to_draft
    kl = soft_slot_loss(logits, logp, ids, to_rows, 0.0)
    mixed = soft_slot_loss(logits, logp, ids, to_rows, 0.3)
    ce = -torch.log_softmax(logits.double(), -1)[torch.arange(2), p.argmax(-1)]
    torch.testing.assert_close(mixed.double(), kl.double() + 0.3 * ce, atol=1e-5, rtol=0)


def test_missing_soft_labels_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"--loss kl: .*--topk") as err:
        require_soft_labels({"labels": torch.zeros(1, 1, 1)})
    assert "\n" not in str(err.value)

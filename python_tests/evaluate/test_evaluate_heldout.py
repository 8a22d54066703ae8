"""Held-out teacher-forced evaluation (flashmap_ext.evaluate) against hand-computed oracle drafters."""
import json

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.evaluate.heldout import HeldoutSequence, add_taps, anchors, slot_hits, summarize
from flashmap_ext.evaluate.report import write_reports
from flashmap_ext.evaluate.run import evaluate, parse_drafter
from flashmap_ext.target import Target

K = 4


class OracleDrafter:
    """Knows the sequences; slot j (1-based) at anchor position a is right iff (a + j) % 3 != 0, else it
    proposes a wrong id. Checks on every call that its memory holds exactly tokens 0..a-1 and the target's
    taps there (what speculate.generate gives a drafter)."""

    num_draft_tokens = K

    def __init__(self, seqs, layers, vocab):
        self.seqs, self.target_layer_ids, self.vocab = seqs, layers, vocab

    def new_memory(self, batch_size, device):
        return {"tokens": [[] for _ in range(batch_size)], "taps": [[] for _ in range(batch_size)]}

    def extend_memory(self, memory, token_ids, taps):
        for b in range(token_ids.shape[0]):
            memory["tokens"][b] += token_ids[b].tolist()
            memory["taps"][b].append(taps[b])

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        out = torch.full((len(anchor_tokens), num_tokens), -1, dtype=torch.long)
        for b, s in enumerate(self.seqs):
            a = int(position[b])
            if a >= len(s.input_ids) - num_tokens:
                continue                      # padded row: not scored
            assert memory["tokens"][b] == s.input_ids[:a]
            assert int(anchor_tokens[b]) == s.input_ids[a]
            assert torch.equal(torch.cat(memory["taps"][b])[:a], s.taps[:a])
            for j in range(1, num_tokens + 1):
                true = s.input_ids[a + j]
                out[b, j - 1] = true if (a + j) % 3 else (true + 1) % self.vocab
        return out


@pytest.fixture(scope="module")
def setup():
    target = Target(tiny_qwen3(vocab_size=61, num_layers=3))
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i, (prompt, answer) in enumerate([(5, 20), (9, 13), (3, 30), (7, 4)]):
        ids = torch.randint(0, 61, (prompt + answer,), generator=g).tolist()
        seqs.append(HeldoutSequence("math" if i % 2 else "chat", str(i), ids, [0] * prompt + [1] * answer))
    add_taps(target, seqs, [0, 2])
    return target, seqs


def hand_computed(seqs, k):
    """Expected slot accuracies and γ by direct counting over every scored anchor."""
    right = [[(a + j) % 3 != 0 for j in range(1, k + 1)] for s in seqs for a in anchors(s, k)]
    n = len(right)
    acc = [sum(r[j] for r in right) / n for j in range(k)]
    runs = []
    for r in right:
        run = 0
        while run < k and r[run]:
            run += 1
        runs.append(run)
    return n, acc, 1 + sum(runs) / n


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_oracle_drafter_accuracy_and_gamma_are_exact(setup, batch_size):
    target, seqs = setup
    got = []  # the oracle knows the rows of its batch in order: one oracle per batch
    for start in range(0, len(seqs), batch_size):
        part = seqs[start:start + batch_size]
        got += slot_hits(OracleDrafter(part, [0, 2], 61), part, K, batch_size=batch_size)
    s = summarize(got, K)
    n, acc, gamma = hand_computed(seqs, K)
    assert s["anchors"] == n
    assert s["slot_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert s["gamma"] == pytest.approx(gamma, abs=1e-12)
    assert 1 < gamma < 1 + K and 0 < min(acc) < 1


def test_anchors_need_k_answer_labels_and_respect_stride():
    s = HeldoutSequence("chat", "x", list(range(10)), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    assert anchors(s, 2) == [3, 4, 5, 6, 7]
    assert anchors(s, 2, stride=2) == [3, 5, 7]
    assert anchors(s, 7) == []


def test_summarize_known_runs():
    h = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 1, 1], [1, 0, 1]], dtype=torch.bool)
    s = summarize([h], 3)
    assert s["slot_accuracy"] == pytest.approx([0.75, 0.75, 0.75])
    assert s["gamma"] == pytest.approx(1 + (2 + 0 + 3 + 1) / 4)
    assert s["run_histogram"] == pytest.approx([0.25, 0.25, 0.25, 0.25])


def test_evaluate_and_reports_with_a_real_random_drafter(setup, tmp_path):
    """A random FlashMap drafter runs through the whole path; its γ lies in [1, 1 + K] and the report files
    hold the same numbers."""
    from flashmap_ext.bench.methods import StepsDrafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    target, seqs = setup
    torch.manual_seed(0)
    d = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4)
    d.reset_parameters(zero_init=False)
    results = evaluate(target, {"fm1": StepsDrafter(d.eval(), 1)}, seqs, 4, batch_size=2)
    s = results["fm1"]["all"]
    assert 1.0 <= s["gamma"] <= 5.0 and s["anchors"] == sum(len(anchors(x, 4)) for x in seqs)
    report = {"meta": {"command": "test", "target": "tiny", "dtype": "fp32", "cpu": "cpu", "bf16_hw": False,
                       "torch_threads": 1, "date": "2026-12-01", "heldout": "mem"},
              "heldout": {"math": {"sequences": 2, "answer_tokens": 17}}, "target_greedy_agreement": 0.5,
              "results": results}
    paths = write_reports(report, tmp_path)
    assert json.loads(paths[0].read_text())["results"]["fm1"]["all"]["gamma"] == s["gamma"]
    assert f"{s['gamma']:.3f}" in paths[1].read_text()
    assert paths[2].stat().st_size > 1000


def test_parse_drafter():
    assert parse_drafter("A=ckpt/x:2") == ("A", "ckpt/x", 2, 1)
    assert parse_drafter("B=ckpt/y") == ("B", "ckpt/y", None, 1)
    assert parse_drafter("C=ckpt/z:1x4") == ("C", "ckpt/z", 1, 4)
    assert parse_drafter("D=c:/w:1") == ("D", "c:/w", 1, 1)
    with pytest.raises(ValueError, match="NAME=DIR"):
        parse_drafter("ckpt/y")


def test_vocab_coverage_counts_slot1_labels_in_the_draft_vocabulary(setup):
    from flashmap_ext.evaluate.heldout import vocab_coverage
    _, seqs = setup
    oracle = OracleDrafter(seqs, [0, 2], 61)
    assert vocab_coverage(oracle, seqs, K) == 1.0                      # no d2t: the whole vocabulary
    rows = torch.arange(0, 61, 2)                                     # even ids only
    oracle.d2t = rows - torch.arange(rows.numel())
    labels = [s.input_ids[a + 1] for s in seqs for a in anchors(s, K)]
    assert vocab_coverage(oracle, seqs, K) == pytest.approx(sum(t % 2 == 0 for t in labels) / len(labels))


def test_noise_mean_drafter_drafts_the_block_of_z_zero_whatever_the_seed(setup):
    from flashmap_ext import draft_block
    from flashmap_ext.bench.methods import NoiseMeanDrafter, StepsDrafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    target, _ = setup
    torch.manual_seed(0)
    d = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4)
    d.reset_parameters(zero_init=False)  # random gates: the noise changes the block
    d.eval()
    memory = d.new_memory(2)
    d.extend_memory(memory, torch.zeros(2, 5, dtype=torch.int64),
                    torch.randn(2, 5, len(d.target_layer_ids) * d.config.d_target))
    anchor = torch.tensor([3, 7])
    mean_block = draft_block(d, memory, anchor, steps=1, noise=torch.zeros(2, 4, d.config.d_target)).tokens
    for seed in (0, 1):
        assert torch.equal(NoiseMeanDrafter(d, 1).draft(memory, anchor, num_tokens=4, seed=seed, position=5),
                           mean_block)
    draws = [StepsDrafter(d, 1).draft(memory, anchor, num_tokens=4, seed=s, position=5) for s in range(4)]
    assert any(not torch.equal(x, mean_block) for x in draws)


def test_a_drafts_spec_evaluates_the_best_of_n_noise_draws(setup, tmp_path):
    """NAME=DIR:1x3 loads FlashMap's mode-seeking drafter (the best of 3 noise draws, `draft_best_of`, tested
    in python_tests/drafters/test_flashmap_mode.py) and it runs through `evaluate` on the same anchors as the
    plain single draw DIR:1."""
    from flashmap_ext.bench.methods import BestOfDrafter, StepsDrafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.evaluate.run import spec_drafter
    target, seqs = setup
    torch.manual_seed(1)
    d = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4)
    d.reset_parameters(zero_init=False)
    d.save_pretrained(tmp_path / "fm")
    best = spec_drafter(target, str(tmp_path / "fm"), *parse_drafter(f"b={tmp_path / 'fm'}:1x3")[2:])
    single = spec_drafter(target, str(tmp_path / "fm"), *parse_drafter(f"s={tmp_path / 'fm'}:1")[2:])
    assert isinstance(best, BestOfDrafter) and (best.steps, best.draws) == (1, 3)
    assert type(single) is StepsDrafter and single.steps == 1
    results = evaluate(target, {"best": best, "single": single}, seqs, 4, batch_size=2)
    assert results["best"]["all"]["anchors"] == results["single"]["all"]["anchors"]
    assert 1.0 <= results["best"]["all"]["gamma"] <= 5.0

"""`flashmap eval --state-probe` (evaluate/state_probe.py) on a tiny target: the network's own accuracy
equals the exact reader's when the network adds nothing to the state's log-likelihood, and the counts
are those of the scored anchors."""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.evaluate.heldout import HeldoutSequence, add_taps, anchors
from flashmap_ext.evaluate.state_probe import markdown, probe
from flashmap_ext.target import Target

K = 4


@pytest.fixture(scope="module")
def setup():
    model = tiny_qwen3(vocab_size=256, hidden_size=32)
    g = torch.Generator().manual_seed(0)
    seqs = [HeldoutSequence("chat", f"s{i}", torch.randint(0, 256, (n,), generator=g).tolist(), [0] * 5 + [1] * (n - 5))
            for i, n in enumerate((30, 22))]
    add_taps(Target(model), seqs, (0, 2))
    return model, seqs


def test_network_reading_only_the_likelihood_scores_as_the_exact_reader(setup):
    model, seqs = setup
    drafter = FlashMapDrafter.for_target(model, n_layers=1, width=32, heads=4, block_size=K, cond_dim=16,
                                         target_layer_ids=(0, 2), two_time=False, state_loglik=True)
    drafter.calibrate_clock()  # adaLN-Zero init: the trunk's logits are 0, only the state term remains
    r = probe(drafter, seqs, [0.0, 0.5, 0.9], seed=3, reader_samples=2000)
    n_anchors = sum(len(anchors(s, K)) for s in seqs)
    assert r["clock"] == "projected"
    for row in r["rows"]:
        assert row["n_slot1"] == n_anchors and row["n_all"] == n_anchors * K
        assert row["network_all"] == row["reader_heldout"]
        assert row["prior_plus_reader_slot1"] == row["network_slot1"]  # a flat prior adds nothing
    assert r["rows"][2]["reader_heldout"] > r["rows"][0]["reader_heldout"]
    assert r["rows"][1]["reader_uniform"] == pytest.approx(0.5, abs=0.06)
    text = markdown({"tiny": r}, {"command": "x", "target": "tiny", "dtype": "fp32", "cpu": "cpu",
                                  "torch_threads": 1, "date": "2026-12-02"})
    assert "clock projected" in text and text.count("\n| 0.") == 3


def test_probe_refuses_a_tau_of_one(setup):
    model, seqs = setup
    drafter = FlashMapDrafter.for_target(model, n_layers=1, width=32, heads=4, block_size=K, cond_dim=16,
                                         target_layer_ids=(0, 2))
    with pytest.raises(ValueError, match="taus"):
        probe(drafter, seqs, [0.5, 1.0])

"""`flashmap bench` pieces: pooled metrics on hand-made records, and the whole pipeline on a tiny random
target with the real Qwen3 tokenizer and real prompts (skipped unless those are already in the asset cache;
nothing is downloaded)."""
import json
import math

import pytest
import torch

from flashmap_ext.bench import assets, datasets
from flashmap_ext.bench.metrics import (Record, acceptance_length, committed_histogram, identity, slot_acceptance,
                                        summarize)


def rec(method, drafted, accepted, tokens=10, time_s=1.0):
    return Record(method, "d", "p", [0] * tokens, time_s, drafted, accepted)


def test_gamma_is_pooled_over_rounds():
    records = [rec("m", [4, 4], [4, 0]), rec("m", [4], [2])]
    assert acceptance_length(records) == pytest.approx((4 + 0 + 2 + 3) / 3)
    assert math.isnan(acceptance_length([rec("hf", [], [])]))


def test_slot_acceptance_is_conditional_on_reaching_the_slot():
    # round 1 accepts slots 1-2 and rejects 3; round 2 rejects slot 1; round 3 drafts 2 and accepts both
    records = [rec("m", [4, 4, 2], [2, 0, 2])]
    assert slot_acceptance(records)[:3] == [pytest.approx(2 / 3), 1.0, 0.0]
    assert math.isnan(slot_acceptance(records)[3])  # never reached: slot 3 was rejected where judged
    assert committed_histogram(records) == [0, 1, 0, 2]


def test_summarize_speedup_and_identity():
    ar = [rec("AR", [0] * 10, [0] * 10, tokens=10, time_s=2.0)]
    spec = [rec("m", [4, 4], [4, 3], tokens=10, time_s=1.0)]
    spec[0].identical = True
    row = summarize(spec, ar)
    assert row["speedup"] == pytest.approx(2.0) and row["identical"] == "yes" and row["tokens_per_s"] == 10.0


def test_identity_cell_counts_near_ties_by_dtype():
    same, tie, bad = (rec("m", [4], [0]) for _ in range(3))
    same.identical, tie.identical, bad.identical = True, False, False
    tie.divergence = {"position": 3, "kind": "token", "margin": 0.0}
    bad.divergence = {"position": 5, "kind": "token", "margin": 2.5}
    assert identity([same, tie], "bf16") == "1/2 (1 near-tie)"
    assert identity([same, tie, bad], "bf16") == "1/3 (1 near-tie) (1 NOT near-ties)"
    assert identity([same], "fp32") == "yes" and identity([rec("AR", [], [])]) == "n/a"


def _cached_or_skip():
    tok_dir = assets.qwen3_tokenizer_dir(download=False)
    have = [datasets.load(n, 1, download=False) for n in ("gsm8k", "mtbench")]
    if tok_dir is None or None in have:
        pytest.skip("Qwen3 tokenizer or prompt packages not in the asset cache (run `flashmap demo` once)")
    return tok_dir


@pytest.fixture
def tiny_real_vocab_target(tmp_path):
    """A tiny random Qwen3 with the real 151,936-row vocabulary, saved with the Qwen3 tokenizer."""
    tok_dir = _cached_or_skip()
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                      tie_word_embeddings=False, eos_token_id=151645)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # sharp logits: no near-ties between batched and single forwards
    model.save_pretrained(tmp_path / "target")
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(tmp_path / "target")
    return tmp_path / "target"


def test_bench_pipeline_on_tiny_target(tiny_real_vocab_target, tmp_path):
    from flashmap_ext.bench.run import BenchConfig, run
    out = tmp_path / "bench"
    cfg = BenchConfig(target=str(tiny_real_vocab_target), drafter="random", datasets=("gsm8k", "mtbench"), n=1,
                      max_new_tokens=6, dtype="fp32", shuffle_n=1, out=str(out))
    results = run(cfg)
    assert results["methods"] == ["AR", "FlashMap-1", "FlashMap-2", "HF greedy", "prompt lookup"]
    mt = results["datasets"]["mtbench"]
    assert mt["AR"]["generations"] == 2 and mt["AR"]["gamma"] == 1.0  # both MT-Bench turns
    for name, rows in results["datasets"].items():
        for method in results["methods"][1:]:
            for d in rows[method]["divergences"]:
                assert abs(d.get("margin", 1.0)) < 1e-3, f"{name}/{method}: divergence not a near-tie: {d}"
    assert set(results["shuffle"]["gsm8k"]) == {"FlashMap-1", "FlashMap-2"}
    assert json.loads((out / "results.json").read_text())["config"]["n"] == 1
    md = (out / "results.md").read_text()
    assert "| FlashMap-2 |" in md and "Shuffle test" in md and "Command:" in md
    assert all((out / f).stat().st_size > 1000 for f in ("acceptance_by_slot.png", "gamma_by_method.png",
                                                          "gamma_hist.png"))

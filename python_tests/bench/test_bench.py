"""`flashmap bench` pieces: pooled metrics on hand-made records, and the whole pipeline on a tiny random
target with the real Qwen3 tokenizer and real prompts (skipped unless those are already in the asset cache;
nothing is downloaded)."""
import dataclasses
import json
import math

import pytest
import torch

from flashmap_ext.assets import datasets
from flashmap_ext.assets import models as assets
from flashmap_ext.bench.metrics import (
    Record,
    acceptance_length,
    committed_histogram,
    identity,
    slot_acceptance,
    summarize,
)


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


def test_slot_acceptance_of_tree_rounds_is_by_depth():
    # 8-node trees of depth 3 and 2: paths of length 3 and 1; a 9th "slot" is never judged
    records = [Record("tree", "d", "p", [0] * 6, 1.0, drafted=[8, 8], accepted=[3, 1], depths=[3, 2])]
    assert slot_acceptance(records) == [1.0, 0.5, 1.0]
    assert acceptance_length(records) == pytest.approx((3 + 1 + 2) / 2) and committed_histogram(records)[4] == 1


@pytest.fixture
def byte_bench(tmp_path, monkeypatch):
    """`flashmap bench` offline: a tiny random Qwen3 over the byte vocabulary (stubbed in for --target), an
    EAGLE-3 checkpoint whose every node drafts the top-k of the anchor's own distribution (deep paths on
    repetitive text), and a two-prompt JSONL set with a two-turn prompt."""
    from conftest import tiny_qwen3
    from flashmap_ext.bench import run as bench_run
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.target import BYTE_EOS, ByteTokenizer, Target
    model = tiny_qwen3(vocab_size=BYTE_EOS + 1)
    d = model.config.hidden_size
    torch.manual_seed(1)
    drafter = Eagle3Drafter.for_target(model, target_layer_ids=[0, 1, 3], num_draft_tokens=4)
    with torch.no_grad():
        drafter.midlayer.self_attn.o_proj.weight.zero_()
        drafter.midlayer.mlp.down_proj.weight.zero_()
        drafter.fc.weight.zero_()[:, 2 * d:] = torch.eye(d)
        drafter.norm.weight.copy_(model.model.norm.weight)
    drafter.save_pretrained(tmp_path / "eagle3")
    prompts = tmp_path / "tiny.jsonl"
    prompts.write_text(json.dumps({"prompt": "abcabcabc"}) + "\n" + json.dumps({"turns": ["Hi", "Again"]}) + "\n")
    monkeypatch.setattr(bench_run, "load_target", lambda spec, dtype: (Target(model), ByteTokenizer()))
    return tmp_path, f"tiny={prompts}"


def test_bench_eagle3_tree_row_is_lossless_and_reported(byte_bench):
    from flashmap_ext.bench.run import BenchConfig, run
    from flashmap_ext.tree import TreeSpec
    tmp, dataset = byte_bench
    out = tmp / "bench"
    cfg = BenchConfig(target="stub", eagle3=str(tmp / "eagle3"), eagle3_tree=TreeSpec(3, 4, 8), datasets=(dataset,),
                      n=2, max_new_tokens=12, dtype="fp32", peers=False, shuffle_n=0, out=str(out))
    results = run(cfg)
    assert results["methods"] == ["AR", "EAGLE-3", "EAGLE-3 tree"]
    assert results["trees"] == {"EAGLE-3 tree": {"depth": 3, "topk": 4, "num_nodes": 8}}
    row = results["datasets"]["tiny"]["EAGLE-3 tree"]
    assert row["generations"] == 3 and row["identical"] == "yes" and not row["divergences"]
    assert row["gamma"] >= 1.0 and row["speedup"] > 0 and row["new_tokens"] == 3 * 12
    assert 0 < len(row["slot_acceptance"]) <= 3  # by depth, not by node
    tree_records = [r for r in results["records"] if r["method"] == "EAGLE-3 tree"]
    assert all(max(r["depths"]) <= 3 < max(r["drafted"]) for r in tree_records)
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["eagle3_tree"] == {"depth": 3, "topk": 4, "num_nodes": 8}
    md = (out / "results.md").read_text()
    assert "| EAGLE-3 tree |" in md and "| tiny | EAGLE-3 tree |" in md and "slot i is depth i" in md
    assert "EAGLE-3 tree: depth 3, top-k 4, 8 nodes per round." in md
    assert all((out / f).stat().st_size > 1000 for f in ("acceptance_by_slot.png", "gamma_by_method.png",
                                                          "gamma_hist.png"))


def test_bench_eagle3_tree_option(byte_bench):
    from flashmap_ext.bench.methods import build_methods
    from flashmap_ext.bench.run import load_target as load_target_and_tokenizer
    from flashmap_ext.commands.bench import eagle3_tree
    from flashmap_ext.tree import TreeSpec
    tmp, _ = byte_bench
    ckpt = str(tmp / "eagle3")
    assert eagle3_tree(None, ckpt) == TreeSpec(7, 10, 16) and eagle3_tree(" 3,4,8", ckpt) == TreeSpec(3, 4, 8)
    assert eagle3_tree("none", ckpt) is None and eagle3_tree(None, None) is None
    target, _ = load_target_and_tokenizer("stub", "fp32")
    names = [m.name for m in build_methods(target, torch.float32, None, None, ckpt, False, eagle3_tree("None", ckpt))]
    assert names == ["AR", "EAGLE-3"]


@pytest.mark.parametrize("argv, message", [
    (["--eagle3", "ckpt", "--eagle3-tree", "7,10"], "--eagle3-tree: tree spec must be DEPTH,TOPK,NODES"),
    (["--eagle3", "ckpt", "--eagle3-tree", "0,10,16"], "--eagle3-tree: TreeSpec: depth must be >= 1"),
    (["--eagle3-tree", "3,4,8"], "--eagle3-tree 3,4,8: needs --eagle3"),
    (["--n", "0"], "--n: must be >= 1"), (["--n", "-1"], "--n: must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1"),
    (["--datasets", "gsm8k,nosuch"], "--datasets: unknown dataset 'nosuch'"),
    (["--datasets", "gsm8k,gsm8k"], "--datasets: gsm8k is named twice (each dataset runs once)"),
    (["--datasets", "mine=a.jsonl,gsm8k,mine=b.jsonl"], "--datasets: mine is named twice (each dataset runs once)"),
    (["--datasets", "mbpp"], "--datasets: mbpp ships in no package: pass mbpp=/path/to/mbpp.jsonl"),
    (["--batch-size", "2", "--n", "1", "--datasets", "gsm8k"],
     "--batch-size 2: more than the 1 prompt(s) of --n 1 per dataset × 1 dataset(s) of --datasets, so no batch "
     "would be full: give a smaller --batch-size or a larger --n"),
    (["--batch-size", "7", "--n", "1"], "--batch-size 7: more than the 6 prompt(s) of --n 1 per dataset × 6")])
def test_bench_eagle3_tree_argument_errors_are_one_line(argv, message, capsys, monkeypatch):
    from flashmap_ext import cli
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    assert cli.main(["bench", "--target", "/nonexistent/model"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"flashmap bench: error: {message}"), err


def test_bench_shuffle_test_honours_n_and_peer_times_are_unmeasured(byte_bench):
    # --n 1 with the default --shuffle-n 2: the shuffle test pools the one prompt the main runs decoded
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset,), n=1, max_new_tokens=6, dtype="fp32",
                      shuffle_n=2, out=str(tmp / "bench"))
    results = run(cfg)
    assert {r["prompts"] for r in results["shuffle"]["tiny"].values()} == {1}
    assert {r["interval"] is None for r in results["shuffle"]["tiny"].values()} == {True}  # one prompt: none
    rows = results["datasets"]["tiny"]
    for peer in ("HF greedy", "prompt lookup"):
        assert rows[peer]["draft_time_s"] is None and rows[peer]["verify_time_s"] is None
        line = next(x for x in (tmp / "bench" / "results.md").read_text().splitlines() if x.startswith(f"| {peer} |"))
        assert line.endswith("| – | – | – |"), line
    assert rows["FlashMap-1"]["verify_time_s"] > 0


def test_bench_interrupted_mid_dataset_keeps_its_finished_prompts(byte_bench, monkeypatch):
    """An interrupt inside a long set lost every prompt of it; now each finished prompt is kept, and the file
    says which set is in progress and how far it got."""
    from flashmap_ext.bench import run as bench_run
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    out = tmp / "bench"
    out.mkdir()
    (out / "gamma_hist.png").write_bytes(b"an earlier run's plot")
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset, dataset.replace("tiny=", "twin=")), n=2,
                      max_new_tokens=6, dtype="fp32", peers=False, shuffle_n=0, out=str(out))
    real_run_turns, calls = bench_run.run_turns, []

    def interrupted_at_second_prompt(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run_turns(*args)
    monkeypatch.setattr(bench_run, "run_turns", interrupted_at_second_prompt)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    saved = json.loads((out / "results.json").read_text())
    assert saved["partial"] == {"datasets_left": [cfg.datasets[1]], "shuffle_test": "off",
                                "in_progress": {"dataset": "tiny", "prompts_done": 1, "prompts": 2}}
    assert {r["prompt_id"] for r in saved["records"]} == {"tiny/0#1"}  # the first prompt, every method
    md = (out / "results.md").read_text()
    assert "datasets finished: none; in progress: tiny (1 of 2 prompts, kept); still to run: twin=" in md
    assert not list(out.glob("*.png"))  # the earlier run's plot (planted above) does not sit beside these tables

def test_bench_interrupted_after_a_dataset_keeps_its_rows(byte_bench, monkeypatch):
    """Bench wrote nothing until every dataset had finished, so an interrupt lost them all. Now
    results.json / results.md hold the finished datasets after each one, marked partial; the complete run
    overwrites them without the mark."""
    from flashmap_ext.bench import run as bench_run
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    out = tmp / "bench"
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset, dataset.replace("tiny=", "twin=")), n=2,
                      max_new_tokens=6, dtype="fp32", peers=False, shuffle_n=1, out=str(out))
    real_run_turns = bench_run.run_turns

    def interrupted_in_twin(target, tokenizer, methods, prompt, *args):
        if prompt.dataset == "twin":
            raise KeyboardInterrupt
        return real_run_turns(target, tokenizer, methods, prompt, *args)
    monkeypatch.setattr(bench_run, "run_turns", interrupted_in_twin)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    saved = json.loads((out / "results.json").read_text())
    assert saved["partial"] == {"datasets_left": [cfg.datasets[1]], "shuffle_test": "not run yet"}
    assert list(saved["datasets"]) == ["tiny"] and saved["shuffle"] == {}
    methods = ["AR", "FlashMap-1", "FlashMap-2"]
    assert saved["methods"] == methods and {r["dataset"] for r in saved["records"]} == {"tiny"}
    assert len(saved["records"]) == 3 * len(methods)  # 2 prompts, one of 2 turns, each method
    assert all(saved["datasets"]["tiny"][m]["generations"] == 3 for m in methods)
    md = (out / "results.md").read_text()
    assert md.startswith("# FlashMap benchmark (PARTIAL)") and "still to run: twin=" in md and "| FlashMap-1 |" in md
    assert not list(out.glob(".*.tmp"))
    monkeypatch.setattr(bench_run, "run_turns", real_run_turns)
    results = run(cfg)
    assert "partial" not in results and "partial" not in json.loads((out / "results.json").read_text())
    assert list(results["datasets"]) == ["tiny", "twin"] and "PARTIAL" not in (out / "results.md").read_text()


def test_bench_shuffle_test_pairs_main_records_and_reports_an_interval(byte_bench):
    # two datasets of two prompts: each FlashMap row's shared-noise counts are the main run's first-turn records,
    # Δγ is pooled from the per-prompt counts, its interval is the bootstrap of those counts (within each dataset
    # for "all datasets"), and results.md shows it
    from flashmap_ext.bench.interval import delta_interval
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset, dataset.replace("tiny=", "twin=")), n=2,
                      max_new_tokens=10, dtype="fp32", peers=False, shuffle_n=2, out=str(tmp / "bench"))
    results = run(cfg)
    shuffle, md = results["shuffle"], (tmp / "bench" / "results.md").read_text()
    assert list(shuffle) == ["tiny", "twin", "all datasets"]
    for name in ("tiny", "twin"):
        for method, row in shuffle[name].items():
            main = {r["prompt_id"]: r for r in results["records"] if r["method"] == method and r["dataset"] == name}
            counts = [p["counts"] for p in row["per_prompt"]]
            shared = [main[p["prompt_id"]]["accepted"] for p in row["per_prompt"]]
            assert [c[:2] for c in counts] == [[sum(a), len(a)] for a in shared]
            a1, r1, a2, r2 = (sum(c[i] for c in counts) for i in range(4))
            assert row["delta"] == pytest.approx((a1 + r1) / r1 - (a2 + r2) / r2) and row["prompts"] == 2
            assert row["interval"] == list(delta_interval(counts)) and row["level"] == 0.95
            low, high = row["interval"]
            assert f"| {name} | {method} |" in md and f"[{low:+.2f}, {high:+.2f}]" in md
    for method, row in shuffle["all datasets"].items():
        counts = [p["counts"] for name in ("tiny", "twin") for p in shuffle[name][method]["per_prompt"]]
        assert row["prompts"] == 4 and row["interval"] == list(delta_interval(counts, [0, 0, 1, 1]))
    assert "95% interval of Δγ" in md and "percentile bootstrap over prompts" in md


def test_slot_table_fills_shorter_rows_with_a_dash():
    from flashmap_ext.bench.report import slot_table
    results = {"datasets": {"d": {"chain": {"slot_acceptance": [0.5, 0.25]}, "tree": {"slot_acceptance": [1.0]}}}}
    assert slot_table(results)[3] == "| d | tree | 1.00 | – |"


def test_round_costs_break_even_from_step_and_round_times():
    from flashmap_ext.bench.metrics import round_costs
    # AR: 10 steps of 0.1 s; FlashMap: 4 rounds of K = 8, 2 + 0 + 1 + 3 accepted, draft 0.05 s + verify 0.25 s each
    ar = [Record("AR", "d", "p", [0] * 10, 1.5, drafted=[0] * 10, accepted=[0] * 10, verify_time_s=1.0,
                 prefill_time_s=0.5)]
    fm = [Record("FM", "d", "p", [0] * 10, 1.7, drafted=[8] * 4, accepted=[2, 0, 1, 3], draft_time_s=0.2,
                 verify_time_s=1.0, prefill_time_s=0.5)]
    c = round_costs(fm, ar)
    assert c["ar_step_s"] == pytest.approx(0.1) and c["draft_s"] == pytest.approx(0.05)
    assert c["verify_s"] == pytest.approx(0.25) and c["break_even_gamma"] == pytest.approx(3.0)
    assert c["gamma"] == pytest.approx(10 / 4) and c["expected_speedup"] == pytest.approx(2.5 / 3.0)
    assert c["mean_drafted"] == 8
    assert math.isnan(round_costs([], ar)["gamma"])


def test_demo_explanation_names_costs_and_cpu_class():
    from flashmap_ext.commands.demo import explain
    ar = Record("AR", "d", "p", [0] * 10, 1.5, drafted=[0] * 10, accepted=[0] * 10, verify_time_s=1.0)
    fm = Record("FlashMap", "d", "p", [0] * 10, 1.7, drafted=[8] * 4, accepted=[2, 0, 1, 3], draft_time_s=0.2,
                verify_time_s=1.0)
    text = " ".join(" ".join(explain([fm, ar], "fp32", {"gpu": None, "bf16_hw": False})).split())
    for part in ("one AR step (1-token target forward): 100 ms", "draft 50 ms + verify of 9 tokens 250 ms",
                 "projected H200 speedup",
                 "break-even γ 3.00, measured γ 2.50", "about 0.83×", "no bf16 hardware", "2.5 AR steps"):
        assert part in text, text
    assert "has bf16 hardware" in " ".join(" ".join(explain([fm, ar], "bf16", {"gpu": None, "bf16_hw": True})).split())
    # --dtype named the dtype: the hardware is not given as the reason
    for hw, line in ((True, "The demo runs fp32, chosen by --dtype (this CPU has bf16 hardware: avx512_bf16/AMX), and "
                            "a 9-token verify costs 2.5 AR steps; a drafter pays from γ 3.0."),
                     (False, "The demo runs fp32, chosen by --dtype (this CPU has no bf16 hardware: no "
                             "avx512_bf16/AMX), and a 9-token verify costs 2.5 AR steps: the target's matmuls")):
        text = " ".join(" ".join(explain([fm, ar], "fp32", {"gpu": None, "bf16_hw": hw}, chosen=True)).split())
        assert line in text and "so the demo runs" not in text, text


@pytest.mark.parametrize("projectable", [True, False])
def test_bench_shape_rows_write_a_pasteable_summary(byte_bench, monkeypatch, projectable):
    """--shapes --auto: every draft-shape row is lossless and results.md has one summary row per (dataset,
    method) with γ, measured speedup, projected H200 speedup and the identity check. The projection is made
    only from a target of real size (here: the threshold lowered to 0); from the tiny test double (under
    100 M parameters) it is dropped and the report says why (it printed a projection from a random target)."""
    from flashmap_ext.bench import shapes
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp / "cache"))   # --auto calibrates into a fresh cache
    if projectable:
        monkeypatch.setattr(shapes, "PROJECTABLE_PARAMS", 0)
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset,), n=2, max_new_tokens=8, dtype="fp32",
                      peers=False, shuffle_n=0, shapes=True, auto=True, out=str(tmp / "bench"))
    results = run(cfg)
    shapes = ["lookup", "lookup + FlashMap-1", "FlashMap-1 multi-noise N=2", "FlashMap-1 multi-noise N=4",
              "FlashMap-1 top-k 8", "FlashMap-1 top-k 16", "FlashMap-1 top-k 32", "auto"]
    assert results["methods"] == ["AR", "FlashMap-1", "FlashMap-2"] + shapes
    rows = results["datasets"]["tiny"]
    assert all(rows[m]["identical"] == "yes" for m in results["methods"][1:])
    md = (tmp / "bench" / "results.md").read_text().splitlines()
    start = md.index("## Summary (γ, measured and projected speedup, lossless check)") + 4
    summary = md[start:md.index("", start)]
    assert [x.split(" | ")[1] for x in summary] == results["methods"]
    for method in results["methods"][1:]:
        line = next(x for x in summary if x.startswith(f"| tiny | {method} |"))
        proj = f"{results['projected_h200'][method]['tiny']:.2f}×" if projectable else "–"
        assert line.endswith(f"| {proj} | yes |"), line
    assert (results["no_projection"] is None) == projectable and bool(results["projected_h200"]) == projectable
    if not projectable:
        assert "no H200 projection: the target has 0." in results["no_projection"]
        assert results["no_projection"] + "." in md


def test_bench_refuses_an_unknown_method_name(byte_bench):
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, dataset = byte_bench
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset,), n=1, max_new_tokens=4, dtype="fp32",
                      peers=False, shuffle_n=0, methods=("FlashMap-1", "FlashMap 2"), out=str(tmp / "bench"))
    with pytest.raises(ValueError, match="--methods: no row named 'FlashMap 2'.*rows: AR, FlashMap-1, FlashMap-2$"):
        run(cfg)
    cfg = dataclasses.replace(cfg, methods=("FlashMap-1 top-k 16",))
    with pytest.raises(ValueError, match=r"'FlashMap-1 top-k 16'.*\(--shapes adds the draft-shape rows"):
        run(cfg)


def test_batch_bench_writes_after_every_batch(byte_bench, monkeypatch):
    """`bench --batch-size` used to write only at the end, so an interrupted run kept
    nothing. Now batch-B.json/.md are rewritten after each batch ("complete": false until the last one)."""
    from flashmap_ext.bench import batch
    from flashmap_ext.bench import run as bench_run
    from flashmap_ext.bench.run import BenchConfig
    tmp, dataset = byte_bench
    monkeypatch.setattr(batch, "load_target", bench_run.load_target)  # the stub target
    seen, real_write = [], batch.write
    monkeypatch.setattr(batch, "write", lambda out, b, r: (seen.append((r["prompts"], r["complete"])),
                                                           real_write(out, b, r)))
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset,), n=2, max_new_tokens=5, dtype="fp32",
                      methods=("FlashMap-1",), out=str(tmp / "batch"))
    results = batch.run_batch(cfg, 1)
    assert seen == [(1, False), (2, False), (2, True)], seen  # the two prompts' first turns, then the ratio
    assert results["complete"] and results["verify_cost_ratio"] > 0
    assert results["methods"]["FlashMap-1"]["identical_to_ar"] == "2/2"
    saved = json.loads((tmp / "batch" / "batch-1.json").read_text())
    assert saved["complete"] and saved["prompts"] == 2
    assert "partial" not in (tmp / "batch" / "batch-1.md").read_text()


def test_batch_bench_refuses_fewer_prompts_than_a_batch_and_names_a_short_last_batch(byte_bench, monkeypatch):
    """`bench --batch-size 2 --n 1` reported "B = 2 ... 1 prompts", a batch it never filled. The batches pool the
    first --n prompts of every dataset; a prompt file holding fewer than --n is refused before the target loads."""
    from flashmap_ext.bench import batch
    from flashmap_ext.bench.run import BenchConfig
    tmp, dataset = byte_bench  # two prompts
    monkeypatch.setattr(batch, "load_target", lambda *a, **k: pytest.fail("the target loaded first"))
    cfg = BenchConfig(target="stub", drafter="random", datasets=(dataset,), n=5, dtype="fp32", out=str(tmp / "b"))
    with pytest.raises(ValueError, match=r"^--batch-size 3: more than the 2 prompt\(s\) of --datasets tiny=.* at "
                                         r"--n 5, so no batch would be full: give a smaller --batch-size$"):
        batch.run_batch(cfg, 3)
    meta = {"batch_size": 2, "dtype": "fp32", "cpu": "cpu", "torch_threads": 1, "load_average": 0, "date": "d"}
    results = {"meta": meta, "prompts": 3, "temperature": 0.0, "max_new_tokens": 4, "K": 8, "verify_cost_ratio": 1.5,
               "methods": {}}
    monkeypatch.setattr(batch.machine, "summary_line", lambda m: "machine")
    assert batch.markdown(results).startswith("B = 2 (the last batch 1), fp32, T = 0.0, 3 prompts,")
    assert batch.markdown({**results, "prompts": 4}).startswith("B = 2, fp32, T = 0.0, 4 prompts,")


def test_bench_help_gives_the_out_default_and_a_rerun_names_the_results_it_replaces(tmp_path, capsys, monkeypatch):
    """A run without --out wrote ./runs/bench, which --help did not say; a rerun replaced results silently."""
    from flashmap_ext import cli
    from flashmap_ext.bench import run as bench_run
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "default: runs/bench in the current folder" in " ".join(capsys.readouterr().out.split())

    def stop(*a, **k):
        raise ValueError("stopped at the target load")
    monkeypatch.setattr(bench_run, "load_target", stop)
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    out, prompts = tmp_path / "out", tmp_path / "tiny.jsonl"
    prompts.write_text(json.dumps({"prompt": "abc"}) + "\n")
    base = ["bench", "--target", "tiny-random", "--n", "1", "--datasets", f"tiny={prompts}", "--out", str(out)]
    assert cli.main(base) == 2
    assert "replacing" not in capsys.readouterr().err  # nothing there yet
    out.mkdir()
    for name in ("results.json", "results.md", "gamma_hist.png", "batch-1.json"):
        (out / name).write_text("{}")
    assert cli.main(base) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"flashmap bench: --out {out}: this run will replace the earlier results.json, results.md, gamma_hist.png"
    monkeypatch.setattr("flashmap_ext.bench.batch.load_target", stop)
    assert cli.main([*base, "--batch-size", "1"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"flashmap bench: --out {out}: this run will replace the earlier batch-1.json"


@pytest.mark.parametrize("selector", [False, True])
def test_block_drafter_tree_rows_come_at_16_and_32_nodes(selector):
    """Every block drafter gets top-4 trees of 16 and 32 nodes over its K slots (DFlash2 also selector trees),
    so chains and trees compare at equal node budgets across FlashMap-1, DFlash and DFlash2."""
    from types import SimpleNamespace

    from flashmap_ext.bench.shapes import shape_methods
    def stand_in(k):  # what the rows read of a block drafter: its K and the three drafting calls
        return SimpleNamespace(num_draft_tokens=k, target_layer_ids=(0,), new_memory=None, extend_memory=None,
                               draft=None)
    drafter = stand_in(7)
    if selector:
        drafter.candidate_selector = object()
    rows = {m.name: m.tree for m in shape_methods(stand_in(8), drafter)}
    kinds = ("top-k", "selector") if selector else ("top-k",)
    name = "DFlash2" if selector else "DFlash"
    for n in (16, 32):
        assert (rows[f"FlashMap-1 top-k {n}"].depth, rows[f"FlashMap-1 top-k {n}"].num_nodes) == (8, n)
        for kind in kinds:
            tree = rows[f"{name} {kind} {n}"]
            assert (tree.depth, tree.topk, tree.num_nodes) == (7, 4, n)


def test_bench_help_names_the_random_eagle3_drafter(capsys):
    from flashmap_ext import cli
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--eagle3 EAGLE3 EAGLE-3 checkpoint dir (rows EAGLE-3 and EAGLE-3 tree), or 'random-eagle3' (a random "
            "EAGLE-3 drafter: the one for --target tiny-random)") in text


def test_bench_spread_takes_one_prompt_per_category_and_records_it(byte_bench):
    """--spread through the bench: with n = 2 the first prompt of each category, each record carrying it."""
    from flashmap_ext.bench.run import BenchConfig, run
    tmp, _ = byte_bench
    path = tmp / "cats.jsonl"
    rows = [("abab", "w"), ("cdcd", "w"), ("efef", "r")]
    path.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in rows))
    cfg = BenchConfig(target="stub", drafter="random", datasets=(f"cats={path}",), n=2, spread=True,
                      max_new_tokens=4, dtype="fp32", peers=False, shuffle_n=0, out=str(tmp / "spread"))
    records = run(cfg)["records"]
    assert {(r["prompt_id"], r["category"]) for r in records} == {("cats/0#1", "w"), ("cats/2#1", "r")}


def test_bench_refuses_a_bad_prompt_file_and_an_unwritable_out_before_loading(tmp_path, capsys, monkeypatch):
    """A bad JSONL line surfaced after the model load (or after the whole run); an --out under a file system
    that takes no folders failed after every prompt had run."""
    from flashmap_ext import cli
    from flashmap_ext.bench import run as bench_run
    monkeypatch.setattr(bench_run, "load_target", lambda *a: pytest.fail("the target was loaded"))
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": "abc"}\n')
    assert cli.main(["bench", "--target", "tiny-random", "--datasets", f"mine={bad}", "--out", str(tmp_path / "o")]) == 2
    assert f"--datasets: {bad}:1: 'turns' must be a non-empty list" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hi"}\n')
    assert cli.main(["bench", "--target", "tiny-random", "--datasets", f"mine={good}", "--out", "/proc/flashmap-x"]) == 2
    assert "--out /proc/flashmap-x: /proc does not take new folders" in capsys.readouterr().err

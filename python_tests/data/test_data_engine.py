"""The refill-batch engine (flashmap_ext.data.engine) against plain per-prompt greedy decoding."""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.data.engine import EngineStats, Job, generate_refill, length_sorted


@torch.no_grad()
def greedy_reference(model, prompt, stops, max_new):
    """Plain greedy: the whole sequence through the model at every step, no cache, no batch, no padding."""
    seq, answer = list(prompt), []
    for _ in range(max_new):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        if token in stops:
            return answer, True
        answer.append(token)
        seq.append(token)
    return answer, False


@pytest.fixture(scope="module")
def model64():
    return tiny_qwen3(vocab_size=61, num_layers=2, dtype=torch.float64)


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 61, (int(torch.randint(1, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("batch_size,refill_at", [(1, 1), (3, 1), (4, 2), (16, 4)])
def test_refill_engine_equals_per_prompt_greedy(model64, batch_size, refill_at):
    stops, max_new = {0, 1, 2, 5, 7}, 14  # several stop ids: rows end at different steps
    ps = prompts(11)
    expected = {i: greedy_reference(model64, p, stops, max_new) for i, p in enumerate(ps)}
    assert len({len(a) for a, _ in expected.values()}) > 2, "fixture should end rows at different lengths"
    stats = EngineStats()
    got = {j.key: (j.answer, j.stopped) for j in generate_refill(
        model64, (Job(i, p) for i, p in enumerate(ps)), stop_ids=stops, pad_id=0, max_new_tokens=max_new,
        batch_size=batch_size, refill_at=refill_at, stats=stats)}
    assert got == expected
    assert stats.prompt_tokens == sum(map(len, ps))
    assert stats.answer_tokens == sum(len(a) for a, _ in expected.values())
    # each row decodes once per token after the prefill's first (and once more to see its stop token)
    assert stats.row_steps == sum(len(a) if s else len(a) - 1 for a, s in expected.values())


def test_refill_engine_fp32_matches_greedy_on_tiny_target():
    model = tiny_qwen3(vocab_size=61, num_layers=2)
    ps, stops = prompts(6, seed=1), {0, 3}
    expected = [greedy_reference(model, p, stops, 10) for p in ps]
    got = {j.key: (j.answer, j.stopped) for j in generate_refill(
        model, (Job(i, p) for i, p in enumerate(ps)), stop_ids=stops, pad_id=0, max_new_tokens=10,
        batch_size=4, refill_at=1)}
    assert [got[i] for i in range(len(ps))] == expected


def test_refill_engine_rejects_bad_sizes(model64):
    with pytest.raises(ValueError, match="batch_size"):
        list(generate_refill(model64, [], stop_ids={0}, pad_id=0, max_new_tokens=4, batch_size=0))
    with pytest.raises(ValueError, match="refill_at"):
        list(generate_refill(model64, [], stop_ids={0}, pad_id=0, max_new_tokens=4, refill_at=0))


def test_length_sorted_sorts_within_windows_only():
    jobs = [Job(i, [0] * n) for i, n in enumerate([5, 1, 3, 9, 2, 4, 7])]
    order = [len(j.prompt) for j in length_sorted(jobs, 3)]
    assert order == [1, 3, 5, 2, 4, 9, 7]


def test_generate_command_writes_records_and_resumes(tmp_path):
    """`flashmap data generate` on the tiny random target: every record carries its provenance; a rerun
    answers nothing new; answers equal plain greedy decoding of the rendered prompt."""
    import json

    from flashmap_ext.cli import main
    from flashmap_ext.target import load_target as load_target_and_tokenizer
    from flashmap_ext.train.data import prompt_ids, stop_token_ids
    from flashmap_ext.train.store import read_records
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "domain": "math", "messages": [
        {"role": "user", "content": f"what is {i} plus {i}?"}]}) + "\n" for i in range(5)))
    argv = ["data", "generate", "--target", "tiny-random", "--prompts", str(prompts), "--out",
            str(tmp_path / "out"), "--max-new-tokens", "6", "--batch-size", "2", "--refill-at", "1",
            "--threads", "1", "--no-progress", "--flush-every", "2", "--dtype", "fp32"]
    assert main(argv) == 0
    recs = {r["id"]: r for r in read_records(tmp_path / "out")}
    assert sorted(recs) == [f"q{i}" for i in range(5)]
    r = recs["q3"]
    assert r["dtype"] == "fp32" and r["target"] == "tiny-random" and r["domain"] == "math"
    assert r["generation"]["max_new_tokens"] == 6 and r["generation"]["temperature"] == 0.0
    assert r["source"] == str(prompts) and r["split"] == "train" and r["finish"] in ("stop", "length")
    target, tok = load_target_and_tokenizer("tiny-random", torch.float32, "cpu")
    expected, stopped = greedy_reference(target.model, prompt_ids(tok, r["messages"][:1]), stop_token_ids(tok), 6)
    assert r["answer_tokens"] == len(expected) and r["finish"] == ("stop" if stopped else "length")
    assert r["messages"][-1]["content"] == tok.decode(expected, skip_special_tokens=False)
    before = sorted(p.read_bytes() for p in (tmp_path / "out").iterdir())
    assert main(argv) == 0                      # resumed: nothing left to answer
    assert sorted(p.read_bytes() for p in (tmp_path / "out").iterdir()) == before


def test_generate_limit_counts_the_prompts_answered_not_the_ones_skipped(tmp_path, capsys):
    """--limit 3 with every other prompt over --max-prompt-tokens: three records, the long ones named."""
    import json

    from flashmap_ext.cli import main
    from flashmap_ext.train.store import read_records
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "domain": "math", "messages": [
        {"role": "user", "content": "x" * 300 if i % 2 else f"what is {i} plus {i}?"}]}) + "\n" for i in range(8)))
    assert main(["data", "generate", "--target", "tiny-random", "--prompts", str(prompts), "--out",
                 str(tmp_path / "out"), "--max-new-tokens", "2", "--max-prompt-tokens", "100", "--limit", "3",
                 "--threads", "1", "--no-progress", "--dtype", "fp32"]) == 0
    assert sorted(r["id"] for r in read_records(tmp_path / "out")) == ["q0", "q2", "q4"]
    assert "2 of 5 prompts skipped (longer than --max-prompt-tokens 100): q1, q3" in capsys.readouterr().err


def test_corpus_folder_feeds_features_and_flow_training(tmp_path):
    """The recipe's path (recipes/train_real_drafters.sh): generate → features on the corpus folder → train
    flow with the slot-decay and head options."""
    import json

    from flashmap_ext.cli import main
    from flashmap_ext.train.features import FeatureCache
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"say {w}"}]})
                               + "\n" for i, w in enumerate(("one", "two", "three", "four"))))
    common = ["--target", "tiny-random", "--no-progress"]
    assert main(["data", "generate", *common, "--prompts", str(prompts), "--out", str(tmp_path / "corpus"),
                 "--max-new-tokens", "16", "--batch-size", "3", "--threads", "1", "--dtype", "fp32"]) == 0
    assert main(["features", *common, "--data", str(tmp_path / "corpus"), "--out", str(tmp_path / "f")]) == 0
    assert len(FeatureCache(str(tmp_path / "f"))) == 4
    assert main(["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
                 "--batch-size", "2", "--out", str(tmp_path / "flow"), "--steps", "2", "--slot-decay", "auto",
                 "--no-head-recompute"]) == 0
    assert (tmp_path / "flow" / "drafter" / "model.safetensors").exists()

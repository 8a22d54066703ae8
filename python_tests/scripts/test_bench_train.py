"""benches/bench_train.py (a short `flashmap train flow` run) as a CPU smoke test: the tiny target, preset
cpu-tiny, the command line's train flow on a feature cache of the chain data; its JSON fields."""
import json

import pytest

from benches import bench_train


def test_chain_samples_follow_their_successor_table():
    samples = bench_train.chain_samples(4, 400, vocab=1024, seed=3)
    assert [s.id for s in samples] == [f"chain/{i}" for i in range(4)]
    assert samples[0].input_ids == bench_train.chain_samples(1, 400, vocab=1024, seed=3)[0].input_ids
    pairs = [(a, b) for s in samples for a, b in zip(s.input_ids, s.input_ids[1:])]
    assert all(0 <= t < 128 for s in samples for t in s.input_ids)  # an eighth of the vocabulary
    successor = {}
    for a, b in pairs:
        successor.setdefault(a, {}).setdefault(b, 0)
        successor[a][b] += 1
    top = sum(max(c.values()) for c in successor.values())
    assert 0.85 <= top / len(pairs) <= 0.97  # one likely successor, p = 0.9 (+ random jumps landing on it)


def test_tiny_run_writes_rates_and_losses(tmp_path):
    path = tmp_path / "train.json"
    assert bench_train.main(["--tiny", "--device", "cpu", "--steps", "6", "--sequences", "4", "--seq-len", "48",
                             "--warmup", "2", "--workdir", str(tmp_path), "--json", str(path)]) == 0
    bench = json.loads(path.read_text())["benchmarks"][0]
    info = bench["extra_info"]
    assert info["steps"] == 6 and len(info["losses"]) == 6 and info["preset"] == "cpu-tiny"
    assert info["steps_per_s"] == pytest.approx(1 / bench["stats"]["median"])
    assert info["tokens_per_s"] == pytest.approx(info["sequences_per_step"] * 48 * info["steps_per_s"])
    assert info["loss_fell"] == (info["last_loss"] < info["first_loss"])
    assert list(tmp_path.iterdir()) == [path]  # the temporary feature cache and run are gone

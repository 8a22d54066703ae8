"""benches/bench_gamma.py (the speedup-vs-γ curve) as a CPU smoke test: a tiny target and drafter, the truncated
oracle accepting exactly j drafts per round, greedy identity with plain decoding, the JSON's rows and summary."""
import json

import pytest

from benches import bench_gamma


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("gamma") / "gamma.json"
    assert bench_gamma.main(["--tiny", "--device", "cpu", "--accepted", "0,3", "--new-tokens", "40",
                             "--prompt-len", "16", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_every_round_accepts_exactly_j_and_the_tokens_are_plain_greedy(result):
    rows = {b["name"]: b["extra_info"] for b in result["benchmarks"]}
    assert set(rows) == {"forward[T=1]", "forward[T=17]", "ar", "gamma[j=0]", "gamma[j=3]", "summary"}
    for j in (0, 3):
        row = rows[f"gamma[j={j}]"]
        assert row["gamma"] == j + 1 and row["identical"] and row["mismatches"] == 0
        assert row["tokens_per_s"] > 0 and row["speedup"] == pytest.approx(row["tokens_per_s"] / rows["ar"]["tokens_per_s"])
    assert all(rows["gamma[j=0]"][f"{p}_ms"] > 0 for p in bench_gamma.PHASES)


def test_summary_follows_the_rows(result):
    rows = {b["name"]: b["extra_info"] for b in result["benchmarks"]}
    s = result["machine_info"]["summary"]
    ar_ms = 1e3 / rows["ar"]["tokens_per_s"]
    assert s["break_even_gamma"] == pytest.approx(1e3 / rows["gamma[j=0]"]["tokens_per_s"] / ar_ms)
    assert s["paper_speedup"] == 6.14 and s["speedup_at_paper_gamma"] > 0
    assert result["machine_info"]["copy_GBps"] is None and rows["forward[T=1]"]["floor_ms"] is None  # no GPU


def test_interpolate_is_piecewise_linear_and_flat_past_the_ends():
    points = {1.0: 10.0, 4.0: 13.0, 8.0: 21.0}
    assert bench_gamma.interpolate(points, 2.0) == pytest.approx(11.0)
    assert bench_gamma.interpolate(points, 7.69) == pytest.approx(13.0 + 8.0 * 3.69 / 4.0)
    assert bench_gamma.interpolate(points, 0.5) == 10.0 and bench_gamma.interpolate(points, 16.0) == 21.0

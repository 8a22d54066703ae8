"""benches/bench_round.py (the end-to-end round timing) as a CPU smoke test, and the loop's Timer."""
import json

import torch

from benches import bench_round
from conftest import tiny_qwen3
from flashmap_ext.speculate import Timer, generate
from support.drafter_doubles import random_flashmap

FIELDS = ("draft_ms", "forward_ms", "verify_op_ms", "bookkeeping_ms", "total_ms", "round_ms")


def test_timer_marks_every_round_in_order():
    model = tiny_qwen3()
    drafter = random_flashmap(model, 4, (1, 2))
    timer = Timer()
    out = generate(model, drafter, [1, 2, 3], 9, timer=timer)
    assert [list(r) for r in timer.rounds] == [["draft", "forward", "verify", "commit"]] * out.stats.rounds
    assert len(timer.starts) == out.stats.rounds
    assert out.tokens == generate(model, drafter, [1, 2, 3], 9).tokens


def test_bench_round_tiny_json(tmp_path):
    path = tmp_path / "round.json"
    assert bench_round.main(["--tiny", "--device", "cpu", "--rounds", "2", "--warmup", "1",
                             "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["machine_info"]["target"]["layers"] == bench_round.TINY["num_hidden_layers"]
    results = [b["extra_info"] for b in data["benchmarks"]]
    assert sorted((r["path"], r["steps"]) for r in results) == [("reference", 1), ("reference", 2)]
    for b, r in zip(data["benchmarks"], results):
        assert all(r[f] > 0 for f in FIELDS), r
        assert r["rounds"] == 2 and r["overhead"] > 0, r
        assert abs(r["total_ms"] - sum(r[f] for f in bench_round.COLUMNS)) < 1e-6
        assert b["stats"]["median"] > 0


def test_bench_round_full_shape_takes_the_fused_path():
    """The Qwen3-8B-shaped target and its drafter, built on the meta device: the right size, and shapes
    the fused CUDA kernels accept (so on a GPU the benchmark times both paths)."""
    target = bench_round.build_target(False, torch.device("meta"), torch.bfloat16)
    assert abs(sum(p.numel() for p in target.model.parameters()) - 8.19e9) < 0.01e9
    drafter = bench_round.build_drafter(target, False, torch.bfloat16)
    c = drafter.config
    assert (c.block_size, c.target_layer_ids, c.head_dim) == (16, (1, 9, 17, 25, 33), 128)
    widths = (c.d_target, c.width, c.cond_dim, int(c.width * c.mlp_ratio))
    assert all(w % 64 == 0 for w in widths)  # flashmap_fused.fused_supported, less the device and dtype

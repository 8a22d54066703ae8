"""The per-kernel profile of the draft step (benches/profile_step.py), dry run on the CPU: bench_draft's tiny
drafter (2 layers), CPU activities. The call counts of the DiT ops per step are worked out from the network
(drafters/flashmap/fused.py), not read from the profile: 17 linears (anchor entry, memory K/V, slot input,
the adaLN modulations, 6 per layer, the final layer), 1 LM head, 4 attentions (self and cross per layer),
10 RMS norms (anchor, memory K per layer, slot, self q/k and cross q per layer), 7 adaLNs (3 per layer, final).
The JSON is in the layout benches/device_summary.py reads (summary.json's line of the device check)."""
import json
import sys
from pathlib import Path

import pytest
import torch

BENCHES = Path(__file__).resolve().parents[2] / "benches"
sys.path.insert(0, str(BENCHES))
PER_STEP = {"flashmap::dit_linear": 17, "flashmap::dit_lm_head": 1, "flashmap::dit_attention": 4,
            "flashmap::dit_rms_norm": 10, "flashmap::dit_adaln": 7}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device check runs it (step profile_step)")
def test_cpu_dry_run_writes_the_per_operator_table(tmp_path, monkeypatch):
    import device_summary
    import profile_step
    monkeypatch.delenv("FLASHMAP_DIT_PRECOMPUTED_MODS", raising=False)  # the modulations' linear runs per step
    steps = 2
    assert profile_step.main(["--json", str(tmp_path / "profile_step.json"), "--markdown",
                              str(tmp_path / "profile_step.md"), "--steps", str(steps), "--length", "40"]) == 0
    result = json.loads((tmp_path / "profile_step.json").read_text())
    rows = {r["name"]: r for r in result["kernels"]["eager"]}
    for op, calls in PER_STEP.items():
        assert rows[op]["calls"] == steps * calls, op
        assert rows[op]["mean_us"] == pytest.approx(rows[op]["total_us"] / rows[op]["calls"])
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    totals = [r["total_us"] for r in result["kernels"]["eager"]]
    assert totals == sorted(totals, reverse=True) and min(totals) > 0
    assert "graph" not in result["kernels"]  # no CUDA graph on a CPU
    markdown = (tmp_path / "profile_step.md").read_text()
    assert "| `flashmap::dit_linear` | 34 |" in markdown and "L = 40" in markdown
    line = device_summary.read_benchmarks(str(tmp_path))["profile_step::eager_step"]
    assert line["group"] == "profile_step" and line["median_us"] > 0
    assert line["launches_per_step"] == pytest.approx(sum(r["calls"] for r in rows.values()) / steps)

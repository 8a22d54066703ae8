"""`verify` (fused acceptance step) vs the straightforward PyTorch composition (softmax, gather, compare,
multinomial: benches/verify_composition.py), K = 16, V = 151,936, B ∈ {1, 8, 64}, temperature 1.

Drafts: `accept` = every draft is the (strongly peaked) argmax, so all 17 slots are processed (worst
case for the CPU kernel, which stops at the first rejection); `random` = uniform random drafts (typical
early rejection). The composition's cost does not depend on the drafts. CPU: fp32 logits; CUDA: bf16
logits, timed by CUDA-graph replay of `calls` calls (extra_info: µs per call, GB/s of logits read).
DESIGN.md §10 targets (measured, never asserted): CPU ≥ 3× the composition at B=1; H200 ≤ 10 µs at
B=1 and ≥ 60% of HBM bandwidth at B=64.

    pytest benches/bench_verify.py --benchmark-only [-k cpu|cuda] [--benchmark-json out.json]
"""
import pytest
import torch
from bench_utils import DEVICES, device_name, graph_replayer
from verify_composition import verify_composition

from flashmap_ext import ops

K, V = 16, 151936


def _inputs(device, B, drafts_kind):
    g = torch.Generator().manual_seed(B)
    logits = torch.randn(B, K + 1, V, generator=g) * 2
    if drafts_kind == "accept":
        drafts = logits[:, :K].argmax(-1)
        logits[torch.arange(B)[:, None], torch.arange(K)[None], drafts] += 30.0
    else:
        drafts = torch.randint(0, V, (B, K), generator=g)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return logits.to(device, dtype), drafts.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B", [1, 8, 64])
@pytest.mark.parametrize("drafts_kind", ["accept", "random"])
@pytest.mark.parametrize("impl", ["flashmap", "composition"])
def test_bench_verify(benchmark, device, B, drafts_kind, impl):
    if impl == "composition" and drafts_kind == "random":
        pytest.skip("the composition's cost does not depend on the drafts")
    benchmark.group = f"verify {device} B={B}"
    logits, drafts = _inputs(device, B, drafts_kind)
    seed = torch.arange(B, device=device)
    if impl == "flashmap":
        fn = lambda: ops.verify(logits, drafts, temperature=1.0, seed=seed, position=0, check=False)
    else:
        fn = lambda: verify_composition(logits, drafts, 1.0)
    calls = 20 if device == "cuda" else 1
    if device == "cuda":
        run, graphed = graph_replayer(fn, calls)
        benchmark.pedantic(run, rounds=30, warmup_rounds=3, iterations=1)
    else:
        graphed = False
        rounds = {1: 15, 8: 5, 64: 2}[B]
        benchmark.pedantic(fn, rounds=rounds, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(device=device_name(device), dtype=str(logits.dtype), B=B, K=K, V=V,
                                drafts=drafts_kind, calls_per_round=calls, cuda_graph=graphed)
    if benchmark.stats is not None:  # None under --benchmark-disable
        per_call = benchmark.stats.stats.median / calls
        benchmark.extra_info.update(us_per_call=per_call * 1e6,
                                    logits_GBps=logits.numel() * logits.element_size() / per_call / 1e9)

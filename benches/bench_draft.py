"""Draft-step latency of the FlashMap drafter (DESIGN.md §10 targets, measured, never asserted).

Shape: the Qwen3-8B FlashMap drafter (6 layers, width 2048, 16 heads, K 16, d 4096, V 151,936) with random
weights, batch 1, memory length L ∈ {128, 1024, 4096}, 1 and 2 steps. Variants in one benchmark group per
(steps, L): `fused` (the dit_ops kernels, replayed from a CUDA graph), `fused-eager` (same ops, launched from
Python), `eager` (the reference drafter), `compiled` (torch.compile of the reference network; L = 1024 only,
to keep compile time inside the device check's budget). extra_info: bytes read from HBM by one draft step
(drafter weights it touches + LM head (+ the embedding for the 2-step midpoint) + memory K/V), achieved
GB/s, the HBM copy bandwidth measured in this run, and `roofline_x` = time / (bytes / copy bandwidth), the
DESIGN.md §10 target being <= 1.3 at 1 step, L = 1024.
Without a GPU: a tiny shape runs once per variant on CPU (a smoke test of the same code).

    pytest benches/bench_draft.py --benchmark-only --benchmark-json=draft.json
"""
from __future__ import annotations

import functools

import pytest
import torch

from flashmap_ext import draft_block
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter
from flashmap_ext.drafters.flashmap import fused as fused
from flashmap_ext.target.tables import TargetTables

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
QWEN3_8B = dict()  # FlashMapConfig defaults are the Qwen3-8B drafter
TINY = dict(n_layers=2, width=128, heads=2, block_size=16, cond_dim=64, target_layer_ids=(0,), d_target=64,
            vocab_size=2000)
LENGTHS = [128, 1024, 4096] if CUDA else [128]
ROUNDS = dict(rounds=30, warmup_rounds=5, iterations=1) if CUDA else dict(rounds=1, warmup_rounds=0, iterations=1)


def _sync():
    if CUDA:
        torch.cuda.synchronize()


@functools.lru_cache(maxsize=1)
def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), the ceiling used for roofline_x."""
    if not CUDA:
        return float("nan")
    a = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")  # 512 MiB
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (start.elapsed_time(end) / 1e3)


@functools.lru_cache(maxsize=1)
def drafter_setup():
    """A random drafter at the benchmark shape, its packed weights and random target tables."""
    cfg = FlashMapConfig(**(QWEN3_8B if CUDA else TINY))
    torch.manual_seed(0)
    with torch.device(DEVICE):
        drafter = FlashMapDrafter(cfg)
        drafter.reset_parameters(zero_init=False)
        emb = torch.randn(cfg.vocab_size, cfg.d_target) * 0.02
        head = torch.randn(cfg.vocab_size, cfg.d_target) * cfg.d_target ** -0.5
    dtype = torch.bfloat16
    drafter = drafter.to(dtype).eval().attach_tables(TargetTables(emb.to(dtype), head.to(dtype), None))
    return drafter, fused.pack_weights(drafter)


def make_memory(drafter, length):
    c = drafter.config
    memory = drafter.new_memory(1)
    memory.reserve(length + 64)
    g = torch.Generator(device=DEVICE).manual_seed(length)
    memory.k.copy_(torch.randn(memory.k.shape, generator=g, device=DEVICE))
    memory.v.copy_(torch.randn(memory.v.shape, generator=g, device=DEVICE))
    memory.length = length
    z = torch.randn(1, c.block_size, c.d_target, generator=g, device=DEVICE) * 20
    return memory, z, torch.tensor([17], device=DEVICE)


def bytes_per_step(packed, memory, steps) -> int:
    """HBM bytes one draft step reads: anchor entry weights once; per evaluation the trunk, final layer and
    LM head weights, the adaLN weights (or, when precomputed, that evaluation's modulation row) plus the
    memory K/V up to the anchor; the embedding once for the 2-step midpoint."""
    nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts if t is not None)
    trunk = sum(nbytes(*vars(layer).values()) for layer in packed.layers)
    adaln = nbytes(next(iter(packed.mods.values()))) if packed.mods else nbytes(packed.adaln_w)
    per_eval = trunk + adaln + nbytes(packed.slot_w, packed.final_w, packed.head_w)
    per_eval += 2 * memory.k[:, :, :, :memory.length + 1].numel() * memory.k.element_size()
    anchor = nbytes(packed.anchor_w, packed.mem_kv_w)
    emb = nbytes(packed.drafter.tables.state_embedding) if steps == 2 else 0
    return anchor + steps * per_eval + emb


def run_variant(variant, drafter, packed, memory, z, anchor, steps):
    """A zero-argument callable running one draft step of `variant` (ending in a device sync)."""
    drafter.allow_fused = False  # `eager`/`compiled` time the reference path; fused variants call the kernels
    if variant == "fused":
        graph = fused.FusedDraftGraph(packed, memory, batch_size=1, steps=steps)
        step = lambda: graph(memory, anchor, z)
    elif variant == "fused-eager":
        step = lambda: fused.fused_draft_block(packed, memory, anchor, steps=steps, noise=z).tokens
    elif variant == "eager":
        step = lambda: draft_block(drafter, memory, anchor, steps=steps, noise=z).tokens
    else:
        compiled = torch.compile(drafter.denoise, dynamic=False)
        original = drafter.denoise
        def step():
            drafter.denoise = compiled
            try:
                return draft_block(drafter, memory, anchor, steps=steps, noise=z).tokens
            finally:
                drafter.denoise = original
    def timed():
        out = step()
        _sync()
        return out
    return timed


VARIANTS = ["fused", "fused-eager", "eager", "compiled"] if CUDA else ["fused-eager", "eager"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("steps", [1, 2])
def test_draft_step(benchmark, steps, length, variant):
    if variant == "compiled" and length != 1024:
        pytest.skip("torch.compile of the reference is measured at L = 1024 only (compile time)")
    drafter, packed = drafter_setup()
    memory, z, anchor = make_memory(drafter, length)
    benchmark.group = f"draft step: steps={steps} L={length}"
    with torch.no_grad():
        fn = run_variant(variant, drafter, packed, memory, z, anchor, steps)
        fn()  # compile / capture / first-call costs stay out of the timing
        tokens = benchmark.pedantic(fn, **ROUNDS)
    assert tokens.shape == (1, drafter.config.block_size)
    nbytes = bytes_per_step(packed, memory, steps)
    stats = benchmark.stats.stats if benchmark.stats is not None else None
    seconds = stats.median if stats is not None else float("nan")
    bw = copy_bandwidth()
    benchmark.extra_info.update(
        device=torch.cuda.get_device_name() if CUDA else "cpu", dtype="bfloat16", batch=1, steps=steps,
        memory_length=length, width=drafter.config.width, layers=drafter.config.n_layers,
        vocab=drafter.config.vocab_size, bytes=nbytes, gb_per_s=nbytes / seconds / 1e9,
        copy_gb_per_s=bw / 1e9, roofline_x=seconds / (nbytes / bw))

"""Measures this machine's `CostTable` once and caches it per machine fingerprint.

One calibration: a `context`-token prefill, then target forwards over 1, 2, 3, 5, 9, 17, 33 new tokens
(logits for all, taps as the drafter needs; each rolled back), the same for widths 1, 9, 33 after a
`long_context`-token cache (the slope: seconds per context token), the drafter's draft call and its memory
update for one round, and the loop's per-round overhead from a short plain `generate`. Each is timed
`repeats` times after a warm-up and the median kept. The table is cached as JSON under
`<flashmap cache>/costs/<fingerprint>.json`, the fingerprint hashing CPU model and flags (or GPU name),
dtype, threads, torch version, the target's and the drafter's shapes: a different machine, dtype or thread
count measures again. A few seconds on a 0.5 B target in fp32 on one AVX2 core.

A table measured under load stays cached: the file records the 1-minute load average at calibration, a
cached table measured at a load much higher than now prints a one-line note, and
`load_or_calibrate(..., refresh=True)` (`flashmap bench --auto --recalibrate`) measures it again.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from flashmap_ext.draft_shapes.cost_model import CostTable

WIDTHS = (1, 2, 3, 5, 9, 17, 33)
SLOPE_WIDTHS = (1, 9, 33)
#: bumped when the table gains a measured field: older cached tables are measured again
TABLE_VERSION = 2


def fingerprint(target, drafter=None) -> dict:
    """What the costs depend on: machine, dtype, threads, torch, target and drafter shapes."""
    from flashmap_ext.cpu import cpu_flags, cpu_model
    flags = sorted(cpu_flags() & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    cfg = target.model.config
    dev = target.device
    return dict(version=TABLE_VERSION,
                device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model(), cpu_flags=flags,
                dtype=str(target.dtype), threads=torch.get_num_threads(), torch=torch.__version__,
                target=[getattr(cfg, "_name_or_path", ""), cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size],
                drafter=_drafter_key(drafter))


def _drafter_key(drafter) -> Optional[list]:
    if drafter is None:
        return None
    inner = getattr(drafter, "inner", drafter)
    params = sum(p.numel() for p in inner.parameters()) if hasattr(inner, "parameters") else 0
    return [type(inner).__name__, params, drafter.num_draft_tokens, getattr(drafter, "steps", None)]


def cache_path(key: dict) -> Path:
    from flashmap_ext.assets.models import cache_dir
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "costs" / f"{digest}.json"


def load_or_calibrate(target, drafter=None, *, refresh: bool = False, **kwargs) -> CostTable:
    """The cached CostTable for this machine, target and drafter, measured (and cached) if missing.

    refresh: measure again and overwrite the cached table (e.g. after one was measured on a busy machine).
    The cache records the load average at calibration; a cached table measured at a load much higher than
    the current one (`busier`) prints a one-line note on stderr and is still used. kwargs go to `calibrate`.
    `target`: a Target or a Hugging Face causal LM (wrapped); anything else is a TypeError naming it.
    """
    from flashmap_ext.speculate import as_target
    target = as_target(target)
    key = fingerprint(target, drafter)
    path = cache_path(key)
    if path.is_file() and not refresh:
        data = json.loads(path.read_text())
        if data.get("fingerprint") == key:
            measured_at, now = data.get("load_average"), load_average()
            if measured_at is not None and busier(measured_at, now):
                from flashmap_ext.assets.models import log
                log(f"cost table {path} was measured at load average {measured_at:.1f}, now {now:.1f}: its costs "
                    "may be inflated; load_or_calibrate(..., refresh=True) or `flashmap bench --auto "
                    "--recalibrate` measures it again")
            return CostTable.from_json(data["table"])
    load = load_average()
    table = calibrate(target, drafter, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(fingerprint=key, load_average=round(max(load, load_average()), 2),
                                    table=table.to_json()), indent=1))
    return table


def load_average() -> float:
    """This machine's 1-minute load average (os.getloadavg)."""
    return os.getloadavg()[0]


def busier(measured_at: float, now: float) -> bool:
    """True when a table measured at load average `measured_at` saw a much busier machine than `now`: at
    least one more busy core (a quarter of the cores on a big machine) than now."""
    return measured_at - now >= max(1.0, (os.cpu_count() or 1) / 4)


def median_time(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _verify_times(target, cache, taps, widths, repeats: int, gen) -> dict:
    """{width: median seconds of a forward over `width` new tokens after `cache` (rolled back each time)};
    a wider forward never costs less: a load spike must not make width look free."""
    def run(width: int) -> Callable[[], None]:
        block = torch.randint(0, target.vocab_size, (1, width), generator=gen).to(target.device)

        def once():
            target.forward(block, cache, num_logits=width, tap_layer_ids=taps)
            target.rollback(cache, width)
        return once
    times, slowest = {}, 0.0
    for w in sorted(widths):
        slowest = times[w] = max(median_time(run(w), repeats), slowest)
    return times


@torch.inference_mode()
def calibrate(target, drafter=None, *, widths: Sequence[int] = WIDTHS, context: int = 64, long_context: int = 512,
              repeats: int = 3) -> CostTable:
    """Measures a CostTable (see the module docstring); `target` a Target or a Hugging Face causal LM (wrapped),
    `drafter` a BlockDrafter or None."""
    from flashmap_ext.speculate import as_target, generate
    target = as_target(target)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=gen).to(target.device)
    taps = () if drafter is None else tuple(drafter.target_layer_ids)
    cache = target.new_cache()
    out = target.forward(prompt, cache, num_logits=1, tap_layer_ids=taps)
    verify_s = _verify_times(target, cache, taps, widths, repeats, gen)
    long_context = min(long_context, target.max_positions - max(widths))
    slopes = {}
    if long_context > context:
        more = torch.randint(0, target.vocab_size, (1, long_context - context), generator=gen).to(target.device)
        target.forward(more, cache, num_logits=1, tap_layer_ids=taps)
        long = _verify_times(target, cache, taps, [w for w in SLOPE_WIDTHS if w in verify_s], repeats, gen)
        slopes = {w: max(t - verify_s[w], 0.0) / (long_context - context) for w, t in long.items()}
        target.rollback(cache, long_context - context)
    draft_s = memory_s = 0.0
    if drafter is not None:
        draft_s, memory_s = _drafter_costs(drafter, prompt, out.taps, repeats)
    plain = generate(target, None, prompt[0, :8], 8)
    overhead = max(0.0, plain.stats.total_time_s - plain.stats.prefill_time_s) / max(plain.stats.rounds, 1) - verify_s[1]
    return CostTable(verify_s, draft_s=draft_s, memory_s=memory_s, overhead_s=max(overhead, 0.0), context=context,
                     verify_context_s=slopes)


def _drafter_costs(drafter, prompt: torch.Tensor, taps, repeats: int) -> tuple:
    """(seconds of one draft call of the full block, seconds of a 2-position memory update)."""
    device = prompt.device
    memory = drafter.new_memory(1, device)
    drafter.extend_memory(memory, prompt[:, :-2], None if taps is None else taps[:, :-2])
    anchor, seed = prompt[:, -1], torch.zeros(1, dtype=torch.int64, device=device)
    position = torch.full((1,), prompt.shape[1] - 2, dtype=torch.int64, device=device)
    draft_s = median_time(lambda: drafter.draft(memory, anchor, num_tokens=drafter.num_draft_tokens, seed=seed,
                                                 position=position), repeats)

    def update():
        fresh = drafter.new_memory(1, device)
        drafter.extend_memory(fresh, prompt[:, -2:], None if taps is None else taps[:, -2:])
    memory_s = median_time(update, repeats)
    return draft_s, memory_s

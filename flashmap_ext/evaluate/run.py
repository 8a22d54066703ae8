"""`flashmap eval`: teacher-forced held-out accuracy per slot and implied γ for several drafters.

    flashmap eval [--target qwen2.5-coder-0.5b] [--heldout data/qwen2.5-coder-0.5b-instruct/heldout]
                  [--per-domain 8] [--drafter NAME=DIR[:STEPS[xDRAWS]] ...] [--out runs/eval]

Drafters default to the four committed checkpoints (FlashMap's flow model with 1 step as flow-1, its
distilled map with 1 and 2 steps as map-1 / map-2, DFlash, EAGLE-3 chain); xDRAWS drafts FlashMap as the best of
DRAWS noise draws (`generate --draws`). Writes eval.json, eval.md and eval.png to --out.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from flashmap_ext.checks import check_output_path, with_article
from flashmap_ext.data.prompts import DOMAINS
from flashmap_ext.evaluate.heldout import (
    HeldoutSequence,
    add_taps,
    check_anchors_left,
    slot_hits,
    summarize,
    vocab_coverage,
)
from flashmap_ext.evaluate.report import figure

# FlashMap's two checkpoints named apart: flow-n = the flow model at n Euler steps, map-n = the distilled map
DEFAULT_DRAFTERS = [
    "flow-1=checkpoints/flashmap-flow-qwen2.5-coder-0.5b:1",
    "map-1=checkpoints/flashmap-map-qwen2.5-coder-0.5b:1",
    "map-2=checkpoints/flashmap-map-qwen2.5-coder-0.5b:2",
    "DFlash=checkpoints/dflash-qwen2.5-coder-0.5b",
    "EAGLE-3=checkpoints/eagle3-qwen2.5-coder-0.5b",
]


def load_heldout(path: str, tokenizer, per_domain: int | None, max_length: int | None) -> list[HeldoutSequence]:
    """The first `per_domain` records of each domain (by id) of a corpus folder or jsonl(.gz), rendered as
    the target sees them. An answer cut at max_new_tokens ("length") loses the end-of-turn token that
    rendering appends, since the target never produced it."""
    from flashmap_ext.train.data import render_conversation, stop_token_ids
    from flashmap_ext.train.store import parts, read_records
    stops = stop_token_ids(tokenizer)
    records = [] if os.path.isdir(path) and not parts(path) else list(read_records(path))
    lacking = next((i for i, r in enumerate(records) if "id" not in r or "messages" not in r), None)
    if lacking is not None:
        raise ValueError(f"--heldout {path}: record {lacking} has no 'id' or 'messages' (held-out records are "
                         "the corpus's: id, domain, messages; `flashmap data generate --split heldout` writes them)")
    stray = next((r for r in records if r.get("domain") not in DOMAINS), None)
    if stray is not None:  # it used to count as chat without a word
        raise ValueError(f"--heldout {path}: record {stray['id']!r} has domain {stray.get('domain')!r}: every held-out "
                         f"record needs one of {', '.join(DOMAINS)} (the per-domain tables are of these)")
    records.sort(key=lambda r: str(r["id"]))  # ids may be numbers
    if not records:
        raise ValueError(f"--heldout {path}: no records (run recipes/grow_corpus.sh or flashmap data generate "
                         f"--split heldout first)")
    out, counts = [], {}
    for r in records:
        d = r["domain"]
        if per_domain is not None and counts.get(d, 0) >= per_domain:
            continue
        counts[d] = counts.get(d, 0) + 1
        s = render_conversation(tokenizer, r["messages"], False, None, r["id"])[0]
        ids, mask = s.input_ids, s.loss_mask
        if r.get("finish") == "length" and ids and ids[-1] in stops:
            ids, mask = ids[:-1], mask[:-1]
        if max_length is not None:
            ids, mask = ids[:max_length], mask[:max_length]
        out.append(HeldoutSequence(d, r["id"], ids, mask, answered_by=r.get("target")))
    return out


def parse_drafter(spec: str) -> tuple[str, str, int | None, int]:
    """'NAME=DIR[:STEPS[xDRAWS]]' → (name, dir, steps or None, draws). DRAWS > 1: FlashMap's mode-seeking
    draft (the best of DRAWS noise draws by the drafter's own probabilities, `generate --draws`). Raises
    ValueError naming the expected form."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--drafter {spec!r}: expected NAME=DIR, NAME=DIR:STEPS or NAME=DIR:STEPSxDRAWS")
    path, _, tail = rest.rpartition(":")
    m = re.fullmatch(r"(\d+)(?:x(\d+))?", tail) if path else None
    if m is None:
        return name, rest, None, 1
    return name, path, int(m[1]), int(m[2] or 1)


def spec_drafter(target, path: str, steps: int | None, draws: int, given: str | None = None):
    """The drafter a parsed --drafter spec names, drafting at `steps` (FlashMap) and, with draws > 1, the best
    of `draws` noise draws. given: the --drafter text, for the error of STEPS on another drafter."""
    from flashmap_ext.bench.methods import BestOfDrafter, StepsDrafter
    from flashmap_ext.drafters.flashmap.model import FlashMapDrafter
    from flashmap_ext.drafters.load import check_draws_differ, load_drafter
    d = load_drafter(path, target)
    if steps is not None and not isinstance(d, FlashMapDrafter):
        raise ValueError(f"--drafter {given or f'{path}:{steps}'}: STEPS (and DRAWS) apply to FlashMap drafters "
                         f"only, not {with_article(type(d).__name__)}")
    if draws > 1:
        check_draws_differ(d, draws, steps, f"--drafter {given or f'{path}:{steps}x{draws}'}")
        return BestOfDrafter(d, steps, draws)
    return StepsDrafter(d, steps) if steps is not None else d


def scored_slots(slots: int, drafter) -> int:
    """The slots a drafter is scored on for --slots `slots`: at most its draft tokens."""
    return min(slots, drafter.num_draft_tokens)


def note_fewer_slots(slots: int, scored: dict) -> None:
    """Says on stderr which drafters draft fewer tokens than --slots `slots` ({name: slots scored}): they are
    scored on all of theirs, so a larger --slots does not change their figures."""
    fewer = [f"{name} {k}" for name, k in scored.items() if k < slots]
    if fewer:
        print(f"--slots {slots}: scored on every draft token of the drafters that draft fewer "
              f"({', '.join(fewer)})", file=sys.stderr)


def evaluate(target, drafters: dict, seqs: list[HeldoutSequence], k: int, *, stride: int = 1,
             batch_size: int = 8) -> dict:
    """{drafter name: {domain | "all": summarize(...)}} plus per-drafter wall seconds; taps computed once."""
    layers = sorted({i for d in drafters.values() for i in d.target_layer_ids})
    add_taps(target, seqs, layers)
    results = {}
    for name, drafter in drafters.items():
        kk = scored_slots(k, drafter)
        start = time.perf_counter()
        hits = slot_hits(drafter, seqs, kk, batch_size=batch_size, stride=stride, dtype=target.dtype)
        by = {d: summarize([h for h, s in zip(hits, seqs) if s.domain == d], kk)
              for d in DOMAINS if any(s.domain == d for s in seqs)}
        by["all"] = summarize(hits, kk)
        results[name] = {**by, "draft_vocab_coverage": vocab_coverage(drafter, seqs, kk, stride),
                         "wall_s": round(time.perf_counter() - start, 1)}
        print(f"eval {name}: γ {figure(by['all']['gamma'])}, slot 1 {figure(by['all']['slot_accuracy'][0])} "
              f"({results[name]['wall_s']} s)", file=sys.stderr, flush=True)
    return results


def run(args) -> int:
    import torch

    from flashmap_ext.bench.machine import chosen_dtype, describe, set_threads
    from flashmap_ext.evaluate.report import write_reports
    from flashmap_ext.target import load_target
    specs = check_args(args)  # argument errors before any model loads
    given = drafter_args(args)
    set_threads(args.threads)
    dtype = chosen_dtype(args.dtype)
    target, tokenizer = load_target(args.target, dtype, "cpu" if not torch.cuda.is_available() else "cuda")
    drafters = {spec[0]: spec_drafter(target, *spec[1:], text) for spec, text in zip(specs, given)}
    seqs = load_heldout(args.heldout, tokenizer, args.per_domain, args.max_length)
    warn_other_answering_model(seqs, args.target, target)
    if args.state_probe:
        return run_state_probe(args, target, drafters, seqs, dtype)
    scored = {name: scored_slots(args.slots, d) for name, d in drafters.items()}
    check_anchors_left(seqs, max(scored.values()), args.stride, args.max_length)
    note_fewer_slots(args.slots, scored)
    results = evaluate(target, drafters, seqs, args.slots, stride=args.stride, batch_size=args.batch_size)
    agreement = greedy_agreement(seqs)
    warn_unnamed_answers(seqs, args.target, agreement)
    report = {"meta": {**describe(), "dtype": dtype, "target": args.target, "heldout": args.heldout,
                       "per_domain": args.per_domain, "stride": args.stride, "slots": max(scored.values()),
                       "max_length": args.max_length},
              "heldout": {d: {"sequences": sum(s.domain == d for s in seqs),
                              "answer_tokens": sum(sum(s.loss_mask) for s in seqs if s.domain == d)}
                          for d in DOMAINS},
              "target_greedy_agreement": agreement,
              "drafters": {spec[0]: {"spec": text.partition("=")[2], "slots": scored[spec[0]]}
                           for spec, text in zip(specs, given)},
              "results": results}
    paths = write_reports(report, Path(args.out))
    print("\n".join(str(p) for p in paths))
    return 0


#: below this greedy agreement, held-out answers that name no answering model were likely written by another one
LOW_AGREEMENT = 0.5


def greedy_agreement(seqs: list[HeldoutSequence]) -> float:
    """Mean over sequences of the share of answer tokens equal to the target's greedy prediction (after `add_taps`)."""
    agree = [sum(g == t for g, t, m in zip(s.greedy[:-1], s.input_ids[1:], s.loss_mask[1:]) if m) /
             max(1, sum(s.loss_mask[1:])) for s in seqs]
    return sum(agree) / max(1, len(agree))


def answering_models_unlike(seqs: list[HeldoutSequence], spec: str, target) -> list[str]:
    """The answering models the records name (their `target` field) that appear, case-insensitively, in neither
    the --target text `spec` nor the loaded model's config `_name_or_path` (a local copy of a model can live at
    any path, so a name found in either counts as this target)."""
    config = getattr(getattr(target, "model", None), "config", None) or getattr(target, "config", None)
    known = f"{spec}\n{getattr(config, '_name_or_path', '') or ''}".lower()
    return sorted({s.answered_by for s in seqs if s.answered_by and s.answered_by.lower() not in known})


def warn_other_answering_model(seqs: list[HeldoutSequence], spec: str, target, command: str = "flashmap eval") -> None:
    """One line on stderr, before anything is scored, when the held-out records name an answering model that
    `answering_models_unlike` finds in neither --target nor the model's config. A warning, not a refusal: the
    scores then measure how the drafters predict another model's answers, so γ says little about this target."""
    other = answering_models_unlike(seqs, spec, target)
    if other:
        print(f"{command}: warning: the --heldout answers were written by {', '.join(other)}, a name in neither "
              f"--target {spec} nor its config: the scores measure drafting another model's answers; answer the "
              f"held-out prompts with this target (flashmap data generate --split heldout --target {spec})",
              file=sys.stderr, flush=True)


def warn_unnamed_answers(seqs: list[HeldoutSequence], target: str, agreement: float) -> None:
    """One line on stderr when no record names its answering model and the target's greedy agreement with the
    answers is below LOW_AGREEMENT: likely another model wrote them (`warn_other_answering_model` covers named
    ones)."""
    if any(s.answered_by for s in seqs) or agreement >= LOW_AGREEMENT:
        return
    print(f"flashmap eval: warning: the --heldout answers name no answering model and the target's greedy agrees "
          f"with them at only {agreement:.4f}: the scores may measure drafting another model's answers; answer the "
          f"held-out prompts with this target (flashmap data generate --split heldout --target {target})",
          file=sys.stderr, flush=True)


def run_state_probe(args, target, drafters: dict, seqs: list[HeldoutSequence], dtype: str) -> int:
    """--state-probe: `evaluate.state_probe.probe` of every FlashMap drafter; state_probe.json/.md in --out."""
    import json

    from flashmap_ext.bench.machine import describe
    from flashmap_ext.drafters.flashmap.model import FlashMapDrafter
    from flashmap_ext.evaluate import state_probe
    inner = {n: getattr(d, "inner", d) for n, d in drafters.items()}
    flashmap = {n: d for n, d in inner.items() if isinstance(d, FlashMapDrafter)}
    if not flashmap:
        raise ValueError("--state-probe: no FlashMap drafter among --drafter (the probe reads a FlashMap flow state)")
    add_taps(target, seqs, sorted({i for d in flashmap.values() for i in d.target_layer_ids}))
    results = {}
    for name, d in flashmap.items():
        results[name] = state_probe.probe(d, seqs, args.probe_taus, k=scored_slots(args.slots, d),
                                          stride=args.stride, dtype=target.dtype)
        mid = next((r for r in results[name]["rows"] if r["tau"] == 0.5), results[name]["rows"][0])
        print(f"state probe {name} ({results[name]['clock']} clock): at τ = {mid['tau']} reader "
              f"{mid['reader_uniform']:.3f} (design {mid['design']:.3f}), network slot 1 {mid['network_slot1']:.3f}",
              file=sys.stderr, flush=True)
    meta = {**describe(), "dtype": dtype, "target": args.target, "heldout": args.heldout,
            "per_domain": args.per_domain, "stride": args.stride}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "state_probe.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / "state_probe.md").write_text(state_probe.markdown(results, meta))
    print(out / "state_probe.json", out / "state_probe.md", sep="\n")
    return 0


def probe_taus(text: str) -> list[float]:
    """--probe-taus: comma-separated clock values in [0, 1). Raises argparse.ArgumentTypeError."""
    import argparse
    try:
        taus = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        taus = []
    if not taus or any(not 0.0 <= x < 1.0 for x in taus):
        raise argparse.ArgumentTypeError(f"expected comma-separated values in [0, 1), got {text!r}")
    return taus


def check_args(args) -> list[tuple[str, str, int | None, int]]:
    """The parsed --drafter specs, after checking every argument without loading a model: ValueError
    (one line, naming the option) for counts out of range, an --out that cannot be a folder (`check_output_path`),
    a missing --heldout path, a bad or repeated NAME=DIR:STEPS or a drafter checkpoint whose config.json is missing
    or invalid (CheckpointError)."""
    for opt, value, low in (("--per-domain", args.per_domain, 1), ("--slots", args.slots, 1),
                            ("--stride", args.stride, 1), ("--max-length", args.max_length, 2),
                            ("--batch-size", args.batch_size, 1), ("--threads", args.threads, 0)):
        if value is not None and value < low:
            raise ValueError(f"{opt}: must be >= {low} (got {value})")
    check_output_path("--out", args.out, folder=True)
    if not Path(args.heldout).exists():
        raise ValueError(f"--heldout {args.heldout}: no such file or folder (a held-out corpus folder or "
                         f".jsonl(.gz); recipes/grow_corpus.sh or flashmap data generate --split heldout writes one)")
    return check_specs(drafter_args(args))


def drafter_args(args) -> list[str]:
    """The --drafter texts given, or DEFAULT_DRAFTERS without any."""
    return args.drafter or DEFAULT_DRAFTERS


def check_specs(raw: list[str]) -> list[tuple[str, str, int | None, int]]:
    """The parsed --drafter specs NAME=DIR[:STEPS[xDRAWS]]; ValueError naming --drafter for a malformed spec, a
    repeated NAME, STEPS other than 1 or 2, DRAWS < 1, or a checkpoint whose config.json is missing or invalid."""
    from flashmap_ext.drafters.load import check_drafter
    specs = [parse_drafter(s) for s in raw]
    for i, (name, path, steps, draws) in enumerate(specs):
        if name in (n for n, *_ in specs[:i]):
            raise ValueError(f"--drafter {raw[i]}: NAME {name} is already used "
                             "(each drafter needs its own name: it is the report's column)")
        if steps is not None and steps not in (1, 2):
            raise ValueError(f"--drafter {raw[i]}: STEPS must be 1 or 2")
        if draws < 1:
            raise ValueError(f"--drafter {raw[i]}: DRAWS must be >= 1")
        check_drafter(path)
    return specs


def add_arguments(p) -> None:
    p.add_argument("--target", default="qwen2.5-coder-0.5b", help="the target the drafters were trained for")
    p.add_argument("--heldout", default="data/qwen2.5-coder-0.5b-instruct/heldout",
                   help="held-out corpus folder or jsonl(.gz) (self-answered, never trained on)")
    p.add_argument("--per-domain", type=int, default=8, help="held-out sequences per domain (math, code, chat)")
    p.add_argument("--drafter", action="append", help="NAME=DIR[:STEPS[xDRAWS]] (repeatable; xDRAWS: FlashMap's best of DRAWS noise draws); default: the committed four (FlashMap as flow-1, map-1, map-2; DFlash; EAGLE-3)")
    p.add_argument("--slots", type=int, default=8, help="K: slots scored (at most each drafter's draft tokens). An anchor is scored "
                   "when its K next tokens are answer tokens, so another K scores other anchors; γ implied "
                   "counts at most K accepted. eval.json records the slots each drafter scored (drafters.NAME.slots) "
                   "and the most of them (meta.slots)")
    p.add_argument("--stride", type=int, default=1, help="score every N-th answer position as an anchor")
    p.add_argument("--max-length", type=int, default=512, help="crop sequences to N tokens")
    p.add_argument("--batch-size", type=int, default=8, help="sequences drafted together")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="target dtype (auto, the default: bench.machine.auto_dtype, bf16 on a GPU or a CPU with "
                        "avx512_bf16, else fp32)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="runs/eval",
                   help="folder for eval.json, eval.md, eval.png (the plot needs matplotlib: without it, it is "
                        "skipped with a one-line note; pip install '.[bench]')")
    p.add_argument("--state-probe", action="store_true",
                   help="instead of γ: per τ, how readable each FlashMap drafter's slot state is to an exact "
                        "reader and to the network itself (evaluate/state_probe.py); state_probe.json/.md")
    p.add_argument("--probe-taus", type=probe_taus, default=[0.0, 0.25, 0.5, 0.75, 0.9, 0.99],
                   metavar="T1,T2,...", help="clock values the state probe scores (default 0,0.25,0.5,0.75,0.9,0.99)")

"""summary.json of benches/device_check.sh, rewritten after every step, and the one-screen summary at the end.

    python benches/device_summary.py WORK_DIR SUMMARY_JSON [--print]

WORK_DIR holds steps.jsonl (one line per step: step, rc, seconds), pytest-benchmark JSON files (their
benchmarks[].stats.median in seconds and extra_info, keyed by file stem and benchmark name; bench_round.py,
bench_gamma.py and bench_train.py write the same layout) and junit XML
files (failed tests, and tests with record_property values such as near_ties). Standard library only.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

# extra_info fields worth a place on the one-screen summary, in this order
HEADLINE = ("us_per_call", "logits_GBps", "roofline_x", "gb_per_s", "forward_ms", "draft_ms", "verify_op_ms",
            "overhead", "overhead_nosync", "x_floor", "gamma", "tokens_per_s", "speedup", "break_even_gamma",
            "speedup_at_paper_gamma", "roofline_at_paper_gamma", "steps_per_s", "first_loss", "last_loss",
            "kernel_us_per_step")


def read_steps(work: str) -> list[dict]:
    path = os.path.join(work, "steps.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def read_benchmarks(work: str) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "*.json"))):
        try:
            data = json.load(open(path))
        except ValueError:  # a file being written when its step was killed
            continue
        stem = os.path.basename(path)[:-5]  # one step's file: the same benchmark may run in several steps
        for b in data.get("benchmarks", []):
            out[f"{stem}::{b['name']}"] = {"group": b.get("group"), "median_us": b["stats"]["median"] * 1e6,
                                           **{k: v for k, v in b.get("extra_info", {}).items() if k != "losses"}}
    return out


def read_tests(work: str) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "*.xml"))):
        try:
            cases = list(ET.parse(path).iter("testcase"))
        except ET.ParseError:
            continue
        for case in cases:
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if props or bad is not None:
                message = (bad.get("message") or "").splitlines()[0][:160] if bad is not None else None
                out[case.get("classname", "") + "::" + case.get("name", "")] = {
                    "failed": bad is not None, **({"message": message} if message else {}), **props}
    return out


def counts(work: str) -> dict:
    """Per junit file: tests, failures + errors, skipped."""
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "*.xml"))):
        try:
            suites = list(ET.parse(path).iter("testsuite"))
        except ET.ParseError:
            continue
        n = lambda key: sum(int(s.get(key, 0)) for s in suites)
        out[os.path.basename(path)[:-4]] = {"tests": n("tests"), "failed": n("failures") + n("errors"),
                                            "skipped": n("skipped")}
    return out


def one_screen(summary: dict) -> str:
    lines = ["", "======== device_check summary"]
    for s in summary["steps"]:
        extra = f"  skipped: {s['skipped']}" if s.get("skipped") else ""
        lines.append(f"  {s['step']:<22} rc={s['rc']:<4} {float(s['seconds']):7.1f}s{extra}")
    for name, c in summary["test_counts"].items():
        lines.append(f"  {name}: {c['tests']} tests, {c['failed']} failed, {c['skipped']} skipped")
    failed = [(k, v) for k, v in summary["tests"].items() if v["failed"]]
    for name, v in failed[:12]:
        lines.append(f"  FAILED {name.split('.')[-1]}: {v.get('message', '')[:100]}")
    if len(failed) > 12:
        lines.append(f"  ... {len(failed) - 12} more failures in summary.json")
    for name, b in summary["benchmarks"].items():
        fields = " ".join(f"{k}={b[k]:.3g}" for k in HEADLINE if isinstance(b.get(k), (int, float)))
        lines.append(f"  {name:<52} {b['median_us']:10.1f} us  {fields}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    work, target = argv[0], argv[1]
    summary = {"steps": read_steps(work), "test_counts": counts(work), "tests": read_tests(work),
               "benchmarks": read_benchmarks(work)}
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, target)
    if "--print" in argv:
        print(one_screen(summary))


if __name__ == "__main__":
    main(sys.argv[1:])

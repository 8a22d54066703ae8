"""`flashmap eval curve`: the learning curve of a long training run: held-out slot-1 accuracy and implied γ
against cumulative optimizer steps and CPU-hours, one line per drafter, plus a Markdown table and the
stopping rule.

    flashmap eval curve series.json --out runs/curve      # writes curve.md and curve.png

series.json lists, per drafter, the evaluated pieces of the run in any order (eval paths relative to the file):

    {"title": "...", "series": [{"name": "DFlash", "points": [
        {"steps": 3000, "cpu_hours": 0.97, "eval": "eval-3000/eval.json", "drafter": "DFlash"}, ...]}]}

`eval` is an eval.json of `flashmap eval`; `drafter` names its column there (default: the series name).
A point takes these keys only: `steps` (a positive integer, each at most once per series), `cpu_hours` (a
finite number >= 0), `eval`, and optionally `drafter` and `epochs` (a finite number >= 0).
A point may give `epochs` (cumulative passes over the training sequences: a corpus that grew between pieces
counts each piece against its own corpus); where any point does, the table and the plot add that axis.
Stopping rule (checkpoints/README.md): if tripling the steps moves held-out slot-1 accuracy (all domains) by
less than 0.02, the run is data-bound and the corpus should grow instead.
"""
from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

TRIPLE, MIN_GAIN = 3.0, 0.02
DOMAINS = ("math", "code", "chat")


POINT_KEYS = {"steps", "cpu_hours", "eval", "drafter", "epochs"}


def load_series(path: Path) -> dict:
    """{"title", "series": [{"name", "points": [{steps, cpu_hours, epochs, slot1 {domain: acc}, gamma, anchors,
    date}]}]}, points sorted by steps. ValueError naming the series file, the series and the point for a
    malformed file, point or eval.json (`check_point`), a step count given twice or a missing drafter;
    FileNotFoundError for a missing file."""
    spec = read_json(path, f"{path}")
    if not isinstance(spec, dict) or not isinstance(spec.get("series"), list) or not spec["series"]:
        raise ValueError(f"{path}: expected {{\"series\": [{{\"name\": ..., \"points\": [...]}}, ...]}}")
    out = []
    for i, s in enumerate(spec["series"]):
        name = s.get("name") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(s.get("points"), list) or not s["points"]:
            raise ValueError(f"{path}: series[{i}] needs a \"name\" and a non-empty \"points\" list")
        points = [load_point(path, name, j, p) for j, p in enumerate(s["points"])]
        steps = [p["steps"] for p in points]
        twice = sorted({n for n in steps if steps.count(n) > 1})
        if twice:
            raise ValueError(f"{path}: series {name!r}: steps {twice} given by more than one point (one "
                             "evaluation per step count)")
        out.append({"name": name, "points": sorted(points, key=lambda q: q["steps"])})
    return {"title": spec.get("title", ""), "series": out}


def read_json(file: Path, where: str):
    """The JSON in `file`; FileNotFoundError / ValueError naming `where` (the series file and point)."""
    if not file.is_file():
        raise FileNotFoundError(f"{where}: no such file {file}")
    try:
        return json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: {file} is not JSON ({err})") from None


def check_point(where: str, p) -> None:
    """ValueError naming `where` for a point that is not {steps: int >= 1, cpu_hours: finite >= 0, eval: str,
    [drafter: str], [epochs: finite >= 0]} (a misspelt key would be ignored, so unknown keys are refused)."""
    if not isinstance(p, dict):
        raise ValueError(f"{where}: expected an object with steps, cpu_hours and eval, got {p!r:.60}")
    unknown = sorted(set(p) - POINT_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (a point takes {sorted(POINT_KEYS)})")
    for key in ("steps", "cpu_hours", "eval"):
        if key not in p:
            raise ValueError(f"{where}: no {key!r}")
    if isinstance(p["steps"], bool) or not isinstance(p["steps"], int) or p["steps"] < 1:
        raise ValueError(f"{where}: steps must be a positive integer, got {p['steps']!r}")
    for key in ("cpu_hours", "epochs"):
        value = p.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    for key in ("eval", "drafter"):
        if key in p and not isinstance(p[key], str):
            raise ValueError(f"{where}: {key} must be a string, got {p[key]!r}")


def load_point(path: Path, name: str, index: int, p) -> dict:
    """One point of series `name`, with the slot-1 accuracies, γ and anchors of its eval.json."""
    where = f"{path}: series {name!r}, points[{index}]"
    check_point(where, p)
    where += f" (steps {p['steps']})"
    report = read_json(path.parent / p["eval"], where)
    drafter = p.get("drafter", name)
    results = report.get("results", {}) if isinstance(report, dict) else {}
    if drafter not in results:
        raise ValueError(f"{where}: {p['eval']} has no drafter {drafter!r} (it has {sorted(results)})")
    r = results[drafter]
    try:
        return {"steps": p["steps"], "cpu_hours": float(p["cpu_hours"]), "epochs": p.get("epochs"),
                "slot1": {d: float(r[d]["slot_accuracy"][0]) for d in (*DOMAINS, "all")
                          if d in r and r[d]["anchors"]},  # a domain without anchors has no figure
                "gamma": float(r["all"]["gamma"]), "anchors": r["all"]["anchors"],
                "date": report.get("meta", {}).get("date", "")}
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: {p['eval']} is not an eval.json of `flashmap eval` (drafter {drafter!r}: "
                         f"{type(err).__name__} {err})") from None


def stopping_rule(points: list[dict]) -> list[dict]:
    """For each point, the first later point with at least TRIPLE× its steps: {from, to, gain, data_bound}
    (gain = slot-1 accuracy over all domains, to minus from; data_bound = gain < MIN_GAIN)."""
    checks = []
    for p in points:
        later = next((q for q in points if q["steps"] >= TRIPLE * p["steps"]), None)
        if later is not None:
            gain = later["slot1"]["all"] - p["slot1"]["all"]
            checks.append({"from": p["steps"], "to": later["steps"], "gain": gain, "data_bound": gain < MIN_GAIN})
    return checks


def recent_rate(points: list[dict]) -> dict | None:
    """The rule applied to the newest stretch: from the last point back to the newest point with at most half
    its steps, the slot-1 gain and that rate carried to a tripling (gain · log 3 / log ratio): {from, to, gain,
    per_tripling, data_bound}. A tripling back from the end may not exist yet; the newest doubling always
    reads the curve where it is now, not where it was (None with no such pair)."""
    last = points[-1]
    earlier = [p for p in points if 2 * p["steps"] <= last["steps"]]
    if not earlier:
        return None
    p = earlier[-1]
    gain = last["slot1"]["all"] - p["slot1"]["all"]
    per_tripling = gain * math.log(TRIPLE) / math.log(last["steps"] / p["steps"])
    return {"from": p["steps"], "to": last["steps"], "gain": gain, "per_tripling": per_tripling,
            "data_bound": per_tripling < MIN_GAIN}


def markdown(curve: dict) -> str:
    """One table row per point, then the stopping-rule verdict per series."""
    lines = ["| drafter | steps | CPU-hours | epochs | slot 1 math / code / chat | slot 1 all | γ implied | anchors |",
             "|---|---|---|---|---|---|---|---|"]
    for s in curve["series"]:
        for p in s["points"]:
            doms = " / ".join(f"{p['slot1'][d]:.3f}" if d in p["slot1"] else "–" for d in DOMAINS)
            epochs = "–" if p.get("epochs") is None else f"{p['epochs']:.1f}"
            lines.append(f"| {s['name']} | {p['steps']:,} | {p['cpu_hours']:.2f} | {epochs} | {doms} | "
                         f"{p['slot1']['all']:.3f} | {p['gamma']:.3f} | {p['anchors']} |")
    lines += ["", f"Stopping rule: if tripling the steps moves held-out slot-1 accuracy (all) by < {MIN_GAIN}, "
                  "the run is data-bound — grow the corpus instead."]
    for s in curve["series"]:
        checks = stopping_rule(s["points"])
        if not checks:
            lines.append(f"- {s['name']}: no pair of points {TRIPLE:g}× apart in steps yet.")
            continue
        c = checks[-1]
        verdict = "data-bound: grow the corpus" if c["data_bound"] else "still step-bound: train on"
        lines.append(f"- {s['name']}: {c['from']:,} → {c['to']:,} steps moved slot 1 by {c['gain']:+.3f} ({verdict}).")
        r = recent_rate(s["points"])
        if r is not None:
            verdict = "data-bound: grow the corpus" if r["data_bound"] else "still step-bound"
            lines.append(f"  Newest stretch: {r['from']:,} → {r['to']:,} steps moved slot 1 by {r['gain']:+.3f}, "
                         f"{r['per_tripling']:+.3f} per tripling at that rate ({verdict}).")
    return "\n".join(lines) + "\n"


def plot(curve: dict, path: Path) -> None:
    """2×2 panels: slot-1 accuracy and implied γ (rows) against steps and CPU-hours (columns); a third column
    against epochs where points give them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)
    keys = ["steps", "cpu_hours"]
    labels = ["cumulative optimizer steps (thousands)", "cumulative CPU-hours"]
    if any(p.get("epochs") is not None for s in curve["series"] for p in s["points"]):
        keys.append("epochs"), labels.append("cumulative epochs (passes over the training sequences)")
    fig, axes = plt.subplots(2, len(keys), figsize=(4.5 * len(keys), 6.4), sharey="row")
    for i, s in enumerate(curve["series"]):
        style = series_style(i)
        for col, x_key in enumerate(keys):
            pts = [p for p in s["points"] if p.get(x_key) is not None]
            x = [p[x_key] for p in pts]
            axes[0][col].plot(x, [p["slot1"]["all"] for p in pts], label=s["name"], **style)
            axes[1][col].plot(x, [p["gamma"] for p in pts], label=s["name"], **style)
    for col, label in enumerate(labels):
        axes[1][col].set_xlabel(label)
    for ax in axes[:, 0]:  # 12000 → "12": five-digit step labels ran into each other
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1000:g}"))
    axes[0][0].set_ylabel("held-out slot-1 accuracy (all)")
    axes[1][0].set_ylabel("implied γ (T = 0)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()  # one legend under the panels, clear of the lines
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 2), fontsize=7, frameon=False)
    title = curve["title"] or "learning curve (held-out, teacher-forced)"
    per_line = int(fig.get_figwidth() * 72 / (9 * 0.6))  # characters of a 9-point font across the figure
    fig.suptitle(textwrap.fill(title, per_line), fontsize=9)  # one long line ran past both edges of the figure
    fig.tight_layout(rect=(0, 0.025 * ((len(names) + 1) // 2) + 0.02, 1, 1))
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend's long names ran past the figure's edges
    plt.close(fig)


def series_style(i: int) -> dict:
    """Line style of the i-th series: matplotlib's 10 default colours, then the same colours dashed, then dotted,
    each with its own marker, so no two of up to 30 series look alike (the 11th series repeated the first's)."""
    markers = "osD^v<>pXh"
    return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[i // 10 % 3], "marker": markers[i * 3 % 10]}


def add_arguments(p) -> None:
    p.add_argument("series", type=Path, help="series.json (see the description above)")
    p.add_argument("--out", type=Path, required=True,
                   help="folder for curve.md and curve.png (created; the plot needs matplotlib: without it, it "
                        "is skipped with a one-line note; pip install '.[bench]')")


def run(args) -> int:
    """Writes OUT/curve.md and OUT/curve.png (skipped with a note without matplotlib); ValueError naming the
    series file and the point for a malformed one."""
    from flashmap_ext.evaluate.report import plot_or_skip
    curve = load_series(args.series)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / "curve.md", args.out / "curve.png"]
    paths[0].write_text(markdown(curve))
    written = paths if plot_or_skip(plot, curve, paths[1]) else paths[:1]
    print("\n".join(map(str, written)), file=sys.stderr)
    return 0

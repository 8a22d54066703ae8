"""`flashmap train snapshot`: a drafter directory from a training checkpoint, for mid-run points of a
learning curve.

`flashmap train STAGE --keep-checkpoints 0` (and `flashmap distill --keep-checkpoints 0`) keeps every
`checkpoints/step-N/model.safetensors` of a run; the run's export (`RUN/drafter`) holds the config and the per-tensor dtypes of a finished drafter. This writes OUT with
that config.json and step N's weights cast to the export's dtypes, so that `flashmap eval` loads it like the
export (a snapshot of the last step holds the export's tensors exactly). A run still under way has no export yet:
`--template DIR` takes the config and dtypes from another drafter folder of the same architecture instead
(e.g. the weights the run was warm-started from).

usage: flashmap train snapshot RUN_KIND_DIR STEP OUT [--template DIR]   # e.g. runs/long/flow 9000 runs/snap/flow-9000
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file

from flashmap_ext.checks import check_int, check_output_path
from flashmap_ext.weights_file import save_weights


def snapshot(run: Path, step: int, out: Path, template: Path | None = None) -> Path:
    """Writes OUT (config.json of RUN's export, or of `template`, and STEP's weights in its dtypes); returns it.
    ValueError for a negative STEP or an OUT that is (or lies under) a file; FileExistsError for a non-empty OUT."""
    check_int("STEP", step, 0)
    weights = run / "checkpoints" / f"step-{step:08d}" / "model.safetensors"
    export = run / "drafter" if template is None else template
    if not weights.is_file():
        steps = sorted(int(d.name[5:]) for d in (run / "checkpoints").glob("step-*") if d.name[5:].isdigit())
        have = f"steps saved: {', '.join(map(str, steps))}" if steps else "no step saved yet"
        raise FileNotFoundError(f"{weights} is missing (RUN {run}, STEP {step}; {have})")
    where = f"RUN {run}" if template is None else "--template"
    for path in (export / "config.json", export / "model.safetensors"):
        if not path.is_file():
            hint = ("; a run under way has no export yet: pass --template DIR, a drafter folder of the same "
                    "architecture (e.g. its warm-start weights)") if template is None else ""
            raise FileNotFoundError(f"{path} is missing ({where}){hint}")
    if template is not None:
        check_template_flags(run, template)
    check_output_path("OUT", str(out), folder=True)  # a file there, or a file for one of its folders
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"OUT {out} exists and is not empty: give a new folder")
    ref = load_file(str(export / "model.safetensors"))
    tensors = load_file(str(weights))
    source = "the export" if template is None else f"--template {template}"
    if set(tensors) != set(ref):
        raise ValueError(f"STEP {step}: its checkpoint and {source} hold different tensors "
                         f"({sorted(set(tensors) ^ set(ref))[:4]}...)")
    shapes = [k for k in sorted(ref) if tensors[k].shape != ref[k].shape]
    if shapes:
        k = shapes[0]
        raise ValueError(f"STEP {step}: its checkpoint and {source} differ in shape ({len(shapes)} tensors; "
                         f"{k}: {tuple(tensors[k].shape)} against {tuple(ref[k].shape)})")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(export / "config.json", out / "config.json")
    save_weights({k: v.to(ref[k].dtype) for k, v in tensors.items()}, out / "model.safetensors")
    return out


def check_template_flags(run: Path, template: Path) -> None:
    """ValueError when the template's config.json disagrees with an on/off flag RUN was started with (its
    run.json "args", a boolean field of the same name in both): options such as `--tau-gated-input` or
    `--tap-input-norm` change what the weights compute without changing their tensors, so the shape check
    alone would pass."""
    try:
        args = json.loads((run / "run.json").read_text())["args"]
    except (OSError, ValueError, KeyError):
        return  # a run without its record: only the tensors can be checked
    config = json.loads((template / "config.json").read_text())
    for name, value in sorted(args.items()):
        if isinstance(value, bool) and isinstance(config.get(name), bool) and config[name] != value:
            raise ValueError(f"--template {template}: its {name} is {config[name]!r}, the run was trained with "
                             f"{value!r} ({run / 'run.json'}): give a template made with the run's flags")


def add_arguments(p) -> None:
    p.add_argument("run", type=Path, help="a training run's folder (its checkpoints/ and its export drafter/)")
    p.add_argument("step", type=int, help="the optimizer step of the checkpoint to take")
    p.add_argument("out", type=Path, help="the drafter folder to write (created; refused if not empty)")
    p.add_argument("--template", type=Path, default=None,
                   help="a drafter folder whose config.json and tensor dtypes to use instead of RUN/drafter "
                        "(for a run that has not exported yet; its tensors must be the checkpoint's)")


def run(args) -> int:
    print(snapshot(args.run, args.step, args.out, args.template))
    return 0

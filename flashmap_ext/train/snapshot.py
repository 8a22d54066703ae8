"""A drafter directory from a training checkpoint, for mid-piece points of a learning curve (issue 25).

`flashmap train --keep-checkpoints 0` keeps every `checkpoints/step-N/model.safetensors` of a run; the run's
export (`RUN/drafter`) holds the config and the per-tensor dtypes of a finished drafter. This writes OUT with
that config.json and step N's weights cast to the export's dtypes, so that `flashmap eval` loads it like the
export (a snapshot of the last step equals the export bit for bit).

usage: python scripts/snapshot_drafter.py RUN_KIND_DIR STEP OUT     # e.g. runs/long/flow 9000 runs/long/snap/flow-9000
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def snapshot(run: Path, step: int, out: Path) -> Path:
    weights = run / "checkpoints" / f"step-{step:08d}" / "model.safetensors"
    export = run / "drafter"
    for path in (weights, export / "config.json", export / "model.safetensors"):
        if not path.is_file():
            raise SystemExit(f"snapshot_drafter: {path} is missing (RUN_KIND_DIR {run}, STEP {step})")
    ref = load_file(str(export / "model.safetensors"))
    tensors = load_file(str(weights))
    if set(tensors) != set(ref):
        raise SystemExit(f"snapshot_drafter: step {step} and the export hold different tensors "
                         f"({sorted(set(tensors) ^ set(ref))[:4]}...)")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(export / "config.json", out / "config.json")
    save_file({k: v.to(ref[k].dtype) for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 3 or not argv[1].isdigit():
        raise SystemExit(__doc__)
    print(snapshot(Path(argv[0]), int(argv[1]), Path(argv[2])))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Refuses a make step that needs more disk than is free: `python scripts/need_disk.py GIB DIR WHAT`.

Exit 1 with one line naming the step, what it needs and what is free (and the usual culprit in this
repository: training checkpoints under runs/), instead of pip's "No space left on device" half-way through.
"""
import shutil
import sys


def main(argv: list[str]) -> int:
    gib, where, what = float(argv[0]), argv[1], argv[2]
    free = shutil.disk_usage(where).free / 2**30
    if free >= gib:
        return 0
    print(f"not enough disk for {what}: it needs about {gib:g} GiB, {where} has {free:.1f} GiB free "
          "(`du -sh runs/*` shows training checkpoints; `--keep-checkpoints N` bounds them)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Materialises the committed drafter checkpoints from git history (checkpoints/MANIFEST.json).

The checkpoint weights were committed once and then removed from the working tree, so that a checkout
stays small (the kernels and tests need no weights); their blobs stay reachable from main's history. This script
writes each file listed in the manifest with `git cat-file blob <id>`, checks its sha256 and is silent when
every file is already there.

usage: python scripts/checkpoints.py            # materialise (what `make checkpoints` runs)
       python scripts/checkpoints.py record PATH...  # add committed files to the manifest (checkpoints/README.md)
       python scripts/checkpoints.py publish NAME SRC_DIR MESSAGE
           # a new version of checkpoints/NAME from a drafter dir (config.json + model.safetensors): floats cast
           # to bf16, then the three steps of checkpoints/README.md "Adding a checkpoint" (two commits)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = Path("checkpoints") / "MANIFEST.json"  # relative to the repository root


def git(root: Path, *args: str, data: bool = False) -> bytes | str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr.decode().strip() or f"git {' '.join(args)} failed")
    return out.stdout if data else out.stdout.decode().strip()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def missing_blob_message(root: Path, entry: dict) -> str:
    try:
        shallow = git(root, "rev-parse", "--is-shallow-repository") == "true"
    except (RuntimeError, OSError):
        return f"checkpoints: {entry['path']} needs a git clone of FlashMap (blob {entry['blob']} comes from its history)"
    if shallow:
        return (f"checkpoints: blob {entry['blob']} of {entry['path']} is not in this shallow clone: "
                "run `git fetch --unshallow`, then `make checkpoints`")
    return (f"checkpoints: blob {entry['blob']} of {entry['path']} is not in this clone: "
            "fetch main's full history (`git fetch origin main`), then `make checkpoints`")


def materialise(root: Path, entry: dict) -> bool:
    """Writes one file if absent or different; True when it was written."""
    path = root / entry["path"]
    if path.is_file() and path.stat().st_size == entry["size"] and sha256_of(path) == entry["sha256"]:
        return False
    try:
        data = git(root, "cat-file", "blob", entry["blob"], data=True)
    except (RuntimeError, OSError):
        raise SystemExit(missing_blob_message(root, entry)) from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry["size"] or digest != entry["sha256"]:
        raise SystemExit(f"checkpoints: blob {entry['blob']} of {entry['path']} has sha256 {digest}, "
                         f"the manifest says {entry['sha256']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def record(root: Path, paths: list[str]) -> None:
    """Adds (or updates) manifest entries for files committed at HEAD: blob id, size, sha256."""
    manifest_path = root / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"files": []}
    entries = {e["path"]: e for e in manifest["files"]}
    for p in paths:
        rel = Path(p).resolve().relative_to(root.resolve()).as_posix()
        try:
            blob = git(root, "rev-parse", f"HEAD:{rel}")
        except RuntimeError:
            raise SystemExit(f"checkpoints record: {rel} is not committed at HEAD (commit it first)") from None
        data = git(root, "cat-file", "blob", blob, data=True)
        entries[rel] = {"path": rel, "blob": blob, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "commit": git(root, "log", "-1", "--format=%h", "--", rel)}
        print(f"recorded {rel}: blob {blob}, {len(data):,} bytes")
    manifest["files"] = sorted(entries.values(), key=lambda e: e["path"])
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


def publish(root: Path, name: str, src: Path, message: str) -> None:
    """checkpoints/NAME := SRC (floating tensors cast to bf16, the dtype the committed drafters are evaluated
    and shipped in; config.json as is, its `torch_dtype` where it has one saying bfloat16), committed, recorded
    in the manifest, then out of the tree."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    for f in ("config.json", "model.safetensors"):
        if not (src / f).is_file():
            raise SystemExit(f"checkpoints publish: SRC_DIR {src} has no {f}")
    dest = root / "checkpoints" / name
    dest.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    if "torch_dtype" in config:
        config["torch_dtype"] = "bfloat16"
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    else:
        shutil.copyfile(src / "config.json", dest / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
              str(dest / "model.safetensors"))
    rel = f"checkpoints/{name}"
    git(root, "add", "-f", f"{rel}/config.json", f"{rel}/model.safetensors")
    git(root, "commit", "-q", "-m", message)
    record(root, [str(dest / "model.safetensors")])
    git(root, "rm", "-q", "--cached", f"{rel}/model.safetensors")
    git(root, "add", str(MANIFEST))
    git(root, "commit", "-q", "-m", f"{rel}: weights out of the tree (blob in checkpoints/MANIFEST.json)")
    print(f"published {rel} from {src}: two commits, weights recorded and untracked")


def main(argv: list[str], root: Path = ROOT) -> None:
    if argv[:1] == ["record"]:
        return record(root, argv[1:])
    if argv[:1] == ["publish"]:
        if len(argv) != 4:
            raise SystemExit(__doc__)
        return publish(root, argv[1], Path(argv[2]), argv[3])
    if argv:
        raise SystemExit(__doc__)
    written = [e["path"] for e in json.loads((root / MANIFEST).read_text())["files"] if materialise(root, e)]
    for path in written:
        print(f"checkpoints: wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])

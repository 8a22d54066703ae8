"""Merging feature caches: one cache from several made in parallel (one `flashmap features` per core).

`flashmap features` writes one cache with one process; on a CPU the target forward is the whole cost, so a
corpus is cut into parts (one per core), each part cached into its own directory, and the parts merged here.
Layout and crash rules are those of `features.py`: shard files are linked (or copied) first, index lines
appended after, so an interrupted merge leaves a valid cache holding a prefix of the sources; rerunning the
same merge skips sources whose sequences are all in the destination already.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Sequence

from flashmap_ext.train.features import CacheBusy, _read_index, _shard_paths, writer_lock

# manifest fields that must agree for two caches to be one (the rest, e.g. data reports, are per run)
_SAME = ("format_version", "target_layer_ids", "hidden_size", "feature_dim", "dtype", "topk")


def _manifest(root: str) -> dict:
    path = os.path.join(root, "manifest.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{root}: not a feature cache (no manifest.json); run `flashmap features`")
    with open(path) as f:
        return json.load(f)


def _link_or_copy(src: str, dst: str) -> None:
    if os.path.exists(dst):
        os.remove(dst)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copyfile(src, dst)


def merge_feature_caches(out: str, sources: Sequence[str]) -> int:
    """Appends the sequences of each cache in `sources` to the cache `out` (created from the first source's
    manifest if missing). Returns the number of sequences added.

    Raises ValueError when a source's manifest differs from `out`'s in any of target_layer_ids,
    hidden_size, feature_dim, dtype, topk or format_version (naming the field), or when a sequence id is in two
    caches (a source partly merged before is refused too: merge into a fresh `out`). Raises
    features.CacheBusy when a process is writing `out` or a source (a merge holds their writer locks).
    """
    if not sources:
        raise ValueError("sources: give at least one feature cache directory")
    for src in sources:  # each exists before any lock file is made in it
        _manifest(src)
    with contextlib.ExitStack() as locks:
        for root in dict.fromkeys([out, *sources]):
            locks.enter_context(writer_lock(root))
        return _merge_locked(out, sources)


def _merge_locked(out: str, sources: Sequence[str]) -> int:
    if not os.path.exists(os.path.join(out, "manifest.json")):
        shutil.copyfile(os.path.join(sources[0], "manifest.json"), os.path.join(out, "manifest.json"))
    want = _manifest(out)
    for src in sources:  # every manifest is checked before anything is written
        meta = _manifest(src)
        for key in _SAME:
            if meta.get(key) != want.get(key):
                raise ValueError(f"{src}: {key}={meta.get(key)!r}, but {out} has {want.get(key)!r}; "
                                 "only caches of the same target taps and dtype merge")
    return sum(_append(out, src) for src in sources)


def _append(out: str, src: str) -> int:
    have = list(_read_index(out, repair=True))
    new = list(_read_index(src))
    ids = {e["id"] for e in have}
    if new and all(e["id"] in ids for e in new):
        return 0  # merged by an earlier run
    clash = sorted(ids.intersection(e["id"] for e in new))
    if clash:
        raise ValueError(f"{src}: {len(clash)} sequence ids are in {out} already (e.g. {clash[0]!r}); "
                         "merge into a fresh directory")
    base = max((e["shard"] for e in have), default=-1) + 1
    topk = _manifest(src).get("topk") or 0
    for shard in sorted({e["shard"] for e in new}):
        for kind, path in _shard_paths(src, shard, topk).items():
            _link_or_copy(path, _shard_paths(out, base + shard, topk)[kind])
    with open(os.path.join(out, "index.jsonl"), "a", encoding="utf-8") as f:
        f.writelines(json.dumps({**e, "shard": base + e["shard"]}) + "\n" for e in new)
        f.flush()
        os.fsync(f.fileno())
    return len(new)


def main(argv: Sequence[str] | None = None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashmap_ext.train.feature_merge",
                                description="Merge feature caches made in parallel into one (see module doc).")
    p.add_argument("--out", required=True, help="destination cache directory (created if missing)")
    p.add_argument("sources", nargs="+", help="feature cache directories made by `flashmap features`")
    args = p.parse_args(argv)
    try:
        n = merge_feature_caches(args.out, args.sources)
    except (ValueError, FileNotFoundError, CacheBusy) as e:
        p.error(str(e))
    print(f"{args.out}: {n} sequences added from {len(args.sources)} caches")


if __name__ == "__main__":
    main()

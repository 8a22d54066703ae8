"""Feature store: the target's taps of a corpus, computed once and kept under the asset cache.

    <asset cache>/features/<config key>/
        config.json              what the key stands for (target fingerprint, taps, dtypes, max_length, ...)
        parts/<part key>/        one feature cache (`train.features`) per corpus part
        views/<view key>/        the parts asked for as one cache (shards hard-linked, `train.feature_merge`)

The config key hashes everything that changes a tap: the target (`target_fingerprint`: its config and a
sample of every weight), the tapped layers, the stored dtype, the target's dtype, `max_length`,
`enable_thinking` and `topk`. A part key names a corpus part by its file name and its first record (corpus
parts only grow by appending, `train.store`), so the same part in any work tree, or on another machine with
the same target, finds its features. A part that grew since is extended with its new sequences only;
a sequence whose tokens differ from the cached ones, or a cached sequence the part no longer has, is
refused (the part was rewritten: remove its folder).
A completed part records the digest of the part file it holds (`source.json`): while the file's bytes are
the same, finding the part again costs that digest only (no tokenising, no token check).
The view key hashes the parts and the sequences each holds, so `flashmap train --features VIEW` always
reads exactly the corpus it was asked for. Older views are kept (they only hold links and an index, and a
training run may be reading one); `rm -r views/` frees nothing but those. Where to: `FLASHMAP_CACHE` (`assets.models.cache_dir`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import torch

from flashmap_ext.assets.models import cache_dir, sha256_file
from flashmap_ext.train.feature_merge import merge_feature_caches
from flashmap_ext.train.features import FeatureCache, _read_index, cache_features, same_tokens_as_cached


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def target_fingerprint(model: torch.nn.Module) -> str:
    """A hash of a target's config and of every parameter's name, shape, dtype and first 4,096 values
    (a different checkpoint differs there): equal for the same weights however they were loaded."""
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None:
        h.update(json.dumps(config.to_diff_dict() if hasattr(config, "to_diff_dict") else str(config),
                            sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(p.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def config_key(fingerprint: str, layer_ids: Sequence[int], *, dtype: str, target_dtype: str,
               max_length: int | None, enable_thinking: bool, topk: int) -> tuple[str, dict]:
    """(key, the fields it hashes) of a feature configuration."""
    fields = {"target": fingerprint, "layers": list(layer_ids), "dtype": dtype, "target_dtype": target_dtype,
              "max_length": max_length, "enable_thinking": bool(enable_thinking), "topk": int(topk)}
    return _digest(fields), fields


def corpus_parts(path: str) -> list[Path]:
    """The parts of a corpus folder (`part-*.jsonl.gz`, sorted) or [path] for one file. ValueError if none."""
    p = Path(path)
    parts = sorted(p.glob("part-*.jsonl.gz")) if p.is_dir() else [p]
    if not parts:
        raise ValueError(f"--data {path}: no part-*.jsonl.gz in this folder")
    return parts


def part_key(part: Path) -> str:
    """A part's key: its file name and the hash of its first record (the part's identity while it grows)."""
    opener = gzip.open if part.name.endswith(".gz") else open
    with opener(part, "rt", encoding="utf-8") as f:
        first = f.readline()
    return f"{part.name.split('.')[0]}-{hashlib.sha256(first.encode()).hexdigest()[:12]}"


SOURCE = "source.json"  # in a part's folder: the digest of the part file whose every sequence it holds


def unchanged_since_cached(part: Path, out: Path) -> bool:
    """True when `out` was completed for exactly these part bytes (its SOURCE names their digest and its
    index still holds the sequences it did then): nothing to tokenise, check or compute."""
    try:
        stamp = json.loads((out / SOURCE).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("sha256") == sha256_file(part)
            and stamp.get("sequences") == len(list(_read_index(str(out)))))


def check_unchanged(part: Path, out: Path, samples: list) -> None:
    """ValueError when part cache `out` holds a sequence of `samples` (the part's now) with other tokens,
    or a sequence the part no longer has: a part cache holds exactly its part's sequences."""
    for _ in same_tokens_as_cached(str(out), samples, str(out), str(part)):
        pass
    now = {s.id for s in samples}
    gone = next((e["id"] for e in _read_index(str(out)) if e["id"] not in now), None)
    if gone is not None:
        raise ValueError(f"{part}: its cache {out} holds sequence {gone!r}, which the part no longer has "
                         "(the part was rewritten: remove its folder and run again)")


def in_store(path: str) -> bool:
    """True when `path`, or what a link there points at, lies in a feature store: anywhere under the
    asset cache's (`cache_dir() / "features"`), or a part or view folder of any store (a folder in
    parts/ or views/ beside a config.json). Writing there would change features other work trees read."""
    real = Path(os.path.realpath(path))
    default = Path(os.path.realpath(cache_dir() / "features"))
    if real == default or default in real.parents:
        return True
    return real.parent.name in ("parts", "views") and (real.parent.parent / "config.json").is_file()


def build(model, tokenizer, data: str, layer_ids: Sequence[int], *, dtype: str = "bf16", target_dtype: str,
          max_length: int | None, enable_thinking: bool = False, topk: int = 0, batch_tokens: int = 2048,
          root: str | None = None, progress: bool = True, log=print) -> str:
    """Caches (or extends) the features of every part of corpus `data` under the store and returns the
    view folder holding all of them as one feature cache. root: the store (default <asset cache>/features)."""
    from flashmap_ext.train.data import DataReport, load_samples
    key, fields = config_key(target_fingerprint(model), layer_ids, dtype=dtype, target_dtype=target_dtype,
                             max_length=max_length, enable_thinking=enable_thinking, topk=topk)
    base = Path(root or cache_dir() / "features") / key
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps(fields, indent=1))
    made, counts = [], []
    for part in corpus_parts(data):
        out = base / "parts" / part_key(part)
        made.append(str(out))
        if unchanged_since_cached(part, out):  # skips tokenising a part whose every sequence is cached
            counts.append([out.name, len(list(_read_index(str(out))))])
            log(f"features: {part.name}: unchanged, {counts[-1][1]} sequences cached -> {out}")
            continue
        report = DataReport()
        samples = list(load_samples(str(part), tokenizer, enable_thinking=enable_thinking, max_length=max_length,
                                    report=report))
        check_unchanged(part, out, samples)
        n = cache_features(model, samples, str(out), layer_ids, dtype=dtype, progress=progress, topk=topk,
                           batch_tokens=batch_tokens, window=256 if batch_tokens > 1 else 1,
                           meta={"part": part.name, "config_key": key})
        log(f"features: {part.name}: {n} new of {len(samples)} sequences -> {out}")
        counts.append([out.name, len(list(_read_index(str(out))))])
        (out / SOURCE).write_text(json.dumps({"sha256": sha256_file(part), "sequences": counts[-1][1]}))
    view = base / "views" / _digest(counts)
    if not (view / "manifest.json").exists() or len(FeatureCache(str(view))) != sum(c for _, c in counts):
        shutil.rmtree(view, ignore_errors=True)
        view.mkdir(parents=True)
        merge_feature_caches(str(view), made)
    return str(view)

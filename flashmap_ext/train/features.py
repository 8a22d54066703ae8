"""Feature cache: the target's tapped hidden states for every training sequence, streamed to disk (DESIGN.md §8).

One target forward per sequence (no KV cache; the LM head only with --topk; `target.taps.compute_taps`) with tap hooks on
the decoder layers in `target_layer_ids`, concatenated in id order into `taps [T, n_taps·d]`. Layout of a cache directory:

    manifest.json        format version, target, target_identity, target_layer_ids, hidden_size, feature_dim, dtype,
                         extra meta
    index.jsonl          one line per sequence: {"id", "shard", "offset", "length"}  (offsets in tokens)
    taps-NNNNN.bin       raw [tokens, feature_dim] rows in `dtype` (bf16 stored as its 16 bits)
    ids-NNNNN.bin        int32 token ids;  mask-NNNNN.bin  uint8 loss mask
    topk_logp-NNNNN.bin  only with manifest "topk" = k (`--topk`): fp16 [tokens, k + 1], the target's k largest
                         next-token log-probabilities and the rest's log-mass (train/soft_labels.py)
    topk_ids-NNNNN.bin   int32 [tokens, k]: their target ids

A sequence's bytes are written (and flushed) before its index line, so the index never points at missing
data; a rerun truncates shard bytes past the last indexed sequence, drops a torn index line and skips ids
already indexed. Nothing accumulates in memory: memory use is flat in the number of sequences. One process
writes a cache at a time: a writer (and a merge into the cache) holds an exclusive lock on `writer.lock` in
it while open, and a second one is refused at once (`CacheBusy`), since two appenders would interleave rows.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.taps import compute_taps
from flashmap_ext.train.soft_labels import topk_logprobs

FORMAT_VERSION = 1
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_NUMPY = {torch.bfloat16: np.uint16, torch.float16: np.float16, torch.float32: np.float32}


# the `flashmap features` option behind a manifest field a cache is resumed only with
_OPTIONS = {"target_layer_ids": "--layers", "dtype": "--dtype", "topk": "--topk", "max_length": "--max-length"}


class CacheBusy(FileExistsError):
    """Another process is writing the feature cache: its exclusive writer exists (holds `writer.lock`)."""


@contextlib.contextmanager
def writer_lock(root: str, what: str = "feature cache",
                why: str = "two writers would interleave rows") -> Iterator[None]:
    """Holds the exclusive, non-blocking lock of directory `root` (created if missing) for the block.

    Raises CacheBusy naming the directory, `what` it holds and the holder's pid when another process (or another
    open writer in this one) holds it; the lock goes with the process, so a killed writer never leaves it stale.
    A directory this call made that holds nothing but the lock file at the end (a refused start) is removed.
    """
    made = not os.path.isdir(root)
    os.makedirs(root, exist_ok=True)
    lock = os.path.join(root, "writer.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise CacheBusy(f"{root}: another process (pid {holder}) is writing this {what}; wait for "
                            f"it to end or give another --out ({why})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        if made and os.listdir(root) == ["writer.lock"]:
            os.remove(lock)
            os.rmdir(root)
        os.close(fd)  # releases the lock


def target_identity(model: torch.nn.Module) -> str:
    """A fingerprint of a target's weights that does not depend on the dtype they are loaded in: every
    parameter's name and shape and the signs of its first 4,096 values (fp32, bf16 and fp16 copies of one
    checkpoint have the same signs, a value that underflows to zero keeping its sign bit). `model`: an HF
    causal LM or an adapter exposing it as `.model`. A cache's manifest records it as "target_identity"
    (`cache_features`), and training refuses a cache of another target (`runner.open_features`)."""
    h = hashlib.sha256()
    for name, p in hf_causal_lm(model).named_parameters():
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(np.packbits(torch.signbit(p.detach().reshape(-1)[:4096]).cpu().numpy()).tobytes())
    return h.hexdigest()[:16]


def _shard_paths(root: str, shard: int, topk: int = 0) -> dict[str, str]:
    kinds = ("taps", "ids", "mask") + (("topk_logp", "topk_ids") if topk else ())
    return {k: os.path.join(root, f"{k}-{shard:05d}.bin") for k in kinds}


def _row_bytes(meta: dict) -> dict[str, int]:
    """Bytes per token of each shard kind of a cache with manifest `meta`."""
    k = meta.get("topk") or 0
    return {"taps": meta["feature_dim"] * DTYPES[meta["dtype"]].itemsize, "ids": 4, "mask": 1,
            "topk_logp": 2 * (k + 1), "topk_ids": 4 * k}


class FeatureWriter:
    """Appends sequences to a cache directory, resuming one that already exists (see module docstring).

    Args:
        root: the cache directory (created if missing).
        meta: manifest fields; `target_layer_ids`, `feature_dim` and `dtype` ("bf16"|"fp16"|"fp32") are
            required; `topk` (k >= 1) adds the soft-label shards; `max_length` (optional) is the crop the
            sequences were rendered with. An existing cache holding sequences must have the same values for
            these, else ValueError; the manifest of one holding none is replaced.
        shard_tokens: rows per shard file before a new shard starts.
    """

    def __init__(self, root: str, meta: dict, shard_tokens: int = 1 << 20):
        for key in ("target_layer_ids", "feature_dim", "dtype"):
            if key not in meta:
                raise ValueError(f"meta: missing {key!r}")
        if meta["dtype"] not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} (got {meta['dtype']!r})")
        self.root, self.shard_tokens = root, shard_tokens
        self.meta = {"format_version": FORMAT_VERSION, **meta}
        self.dtype = DTYPES[meta["dtype"]]
        self.topk = int(meta.get("topk") or 0)
        self._files = None
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(writer_lock(root))  # CacheBusy when another writer has it; close() frees it
        try:
            self._check_or_write_manifest()
            self.done, self.shard, self.used = self._recover()
            self._index = open(os.path.join(root, "index.jsonl"), "a", encoding="utf-8")
        except BaseException:
            self._lock.close()
            raise

    def _check_or_write_manifest(self):
        path = os.path.join(self.root, "manifest.json")
        if os.path.exists(path) and next(_read_index(self.root), None) is not None:
            with open(path) as f:
                old = json.load(f)
            for key in ("format_version", "target_layer_ids", "feature_dim", "dtype", "topk", "max_length"):
                if old.get(key) != self.meta.get(key):
                    same = f"give the cache's {_OPTIONS[key]} or " if key in _OPTIONS else "use "
                    raise ValueError(f"{path}: existing cache has {key}={old.get(key)!r}, asked for "
                                     f"{self.meta.get(key)!r}; {same}another --out")
            return
        with open(path + ".tmp", "w") as f:
            json.dump(self.meta, f, indent=1)
        os.replace(path + ".tmp", path)

    def _recover(self) -> tuple[set[str], int, int]:
        """Reads the index (dropping a torn line), truncates shard bytes past the last indexed row."""
        entries = list(_read_index(self.root, repair=True))
        shard = max((e["shard"] for e in entries), default=0)
        used = max((e["offset"] + e["length"] for e in entries if e["shard"] == shard), default=0)
        row = _row_bytes(self.meta)
        for kind, path in _shard_paths(self.root, shard, self.topk).items():
            if os.path.exists(path):
                os.truncate(path, used * row[kind])
        return {e["id"] for e in entries}, shard, used

    def add(self, id: str, input_ids: Sequence[int], loss_mask: Sequence[int], taps: torch.Tensor,
            topk: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Writes one sequence: taps [T, feature_dim] (any float dtype; cast to the cache dtype), T = len(ids);
        with a `topk` cache also topk = (logp [T, k + 1], ids [T, k]) from `soft_labels.topk_logprobs`."""
        t = len(input_ids)
        if taps.shape != (t, self.meta["feature_dim"]) or len(loss_mask) != t:
            raise ValueError(f"sequence {id!r}: taps {tuple(taps.shape)}, {t} ids and {len(loss_mask)} mask "
                             f"entries; expected taps ({t}, {self.meta['feature_dim']})")
        k = self.topk
        if (topk is None) != (k == 0) or (k and (topk[0].shape != (t, k + 1) or topk[1].shape != (t, k))):
            got = None if topk is None else [tuple(x.shape) for x in topk]
            raise ValueError(f"sequence {id!r}: topk {got}; this cache expects "
                             f"{'none' if not k else f'([{t}, {k + 1}], [{t}, {k}])'}")
        if self.used and self.used + t > self.shard_tokens:
            self.close_shard()
            self.shard, self.used = self.shard + 1, 0
        if self._files is None:
            self._files = {kind: open(p, "ab") for kind, p in _shard_paths(self.root, self.shard, k).items()}
        self._files["taps"].write(taps.detach().to("cpu", self.dtype).contiguous().view(torch.uint8).numpy().tobytes())
        if k:
            self._files["topk_logp"].write(topk[0].detach().to("cpu", torch.float16).numpy().tobytes())
            self._files["topk_ids"].write(topk[1].detach().to("cpu", torch.int32).numpy().tobytes())
        self._files["ids"].write(np.asarray(input_ids, dtype=np.int32).tobytes())
        self._files["mask"].write(np.asarray(loss_mask, dtype=np.uint8).tobytes())
        for f in self._files.values():
            f.flush()
        self._index.write(json.dumps({"id": id, "shard": self.shard, "offset": self.used, "length": t}) + "\n")
        self._index.flush()
        self.used += t
        self.done.add(id)

    def close_shard(self):
        for f in (self._files or {}).values():
            os.fsync(f.fileno())
            f.close()
        self._files = None

    def close(self):
        try:
            self.close_shard()
            os.fsync(self._index.fileno())
            self._index.close()
        finally:
            self._lock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_index(root: str, repair: bool = False) -> Iterable[dict]:
    """Streams index.jsonl; a torn last line is skipped (and cut from the file when `repair`)."""
    path = os.path.join(root, "index.jsonl")
    if not os.path.exists(path):
        return
    good = 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            good += len(line)
            if line.strip():
                yield json.loads(line)
    if repair and good != os.path.getsize(path):
        os.truncate(path, good)


class FeatureCache(torch.utils.data.Dataset):
    """Read side of a cache directory: memory-mapped shards, one item per indexed sequence.

    Item i: {"id": str, "input_ids": [T] int64, "loss_mask": [T] bool, "taps": [T, feature_dim] in the cache
    dtype}, plus "topk_logp" [T, k + 1] fp16 and "topk_ids" [T, k] int64 when the cache has soft labels
    (`topk` = k > 0). Shards are mapped lazily, so a Dataset copied into DataLoader workers opens its own maps.
    """

    def __init__(self, root: str, layers: Sequence[int] | None = None):
        """layers: read only the taps of these target layers (a subset of the cache's, any order kept
        as given); `meta` then describes the view. Raises ValueError naming a layer the cache lacks."""
        path = os.path.join(root, "manifest.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{root}: not a feature cache (no manifest.json); run `flashmap features`")
        with open(path) as f:
            self.meta = json.load(f)
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path}: format_version {self.meta.get('format_version')} != {FORMAT_VERSION}")
        self.root, self.dtype = root, DTYPES[self.meta["dtype"]]
        self.topk = int(self.meta.get("topk") or 0)
        index = list(_read_index(root))
        self.ids = [e["id"] for e in index]
        # [N, 3] (shard, offset, length): compact, as an index of millions of dicts would cost gigabytes
        self.locations = np.array([[e["shard"], e["offset"], e["length"]] for e in index], dtype=np.int64)
        self._maps: dict = {}
        self._stored_dim, self._columns = self.meta["feature_dim"], None
        if layers is not None:
            self._select(list(layers))

    def _select(self, layers: list[int]) -> None:
        have = list(self.meta["target_layer_ids"])
        missing = [i for i in layers if i not in have]
        if missing or not layers:
            raise ValueError(f"{self.root}: taps of layers {missing or layers} requested, the cache holds "
                             f"{have}: cache them with `flashmap features --layers {','.join(map(str, layers))}`")
        if layers == have:
            return
        d = self.meta["hidden_size"]
        self._columns = torch.cat([torch.arange(have.index(i) * d, (have.index(i) + 1) * d) for i in layers])
        self.meta = {**self.meta, "target_layer_ids": layers, "feature_dim": d * len(layers)}

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def entries(self) -> list[dict]:
        """The index as dicts {"id", "shard", "offset", "length"}."""
        return [{"id": i, "shard": int(s), "offset": int(o), "length": int(n)}
                for i, (s, o, n) in zip(self.ids, self.locations)]

    def tokens(self, i: int) -> np.ndarray:
        """[T] int32: the token ids of sequence i, without reading its taps."""
        shard, offset, length = (int(x) for x in self.locations[i])
        return np.array(self._map(shard, "ids", np.int32)[offset:offset + length])

    def count_token(self, token: int) -> int:
        """How often token id `token` occurs in the cached sequences, from the ids shards only (4 bytes a token,
        one vectorised pass per shard; rows past the last indexed sequence of a shard are not counted)."""
        if not len(self):
            return 0
        ends = np.zeros(int(self.locations[:, 0].max()) + 1, dtype=np.int64)
        np.maximum.at(ends, self.locations[:, 0], self.locations[:, 1] + self.locations[:, 2])
        return sum(int(np.count_nonzero(self._map(int(s), "ids", np.int32)[:ends[s]] == token))
                   for s in np.flatnonzero(ends))

    def loss_mask(self, i: int) -> torch.Tensor:
        """[T] bool: the loss mask of sequence i, without reading its ids or taps."""
        shard, offset, length = (int(x) for x in self.locations[i])
        return torch.from_numpy(np.array(self._map(shard, "mask", np.uint8)[offset:offset + length])).bool()

    def _map(self, shard: int, kind: str, dtype, width: int | None = None) -> np.memmap:
        key = (shard, kind)
        if key not in self._maps:
            path = _shard_paths(self.root, shard, self.topk)[kind]
            rows = os.path.getsize(path) // (np.dtype(dtype).itemsize * (width or 1))
            self._maps[key] = np.memmap(path, dtype=dtype, mode="r", shape=(rows, width) if width else (rows,))
        return self._maps[key]

    def __getitem__(self, i: int) -> dict:
        shard, offset, length = (int(x) for x in self.locations[i])
        sl = slice(offset, offset + length)
        taps = torch.from_numpy(np.array(self._map(shard, "taps", _NUMPY[self.dtype], self._stored_dim)[sl]))
        if self._columns is not None:
            taps = taps[:, self._columns]
        item = {"id": self.ids[i],
                "input_ids": torch.from_numpy(np.array(self._map(shard, "ids", np.int32)[sl])).long(),
                "loss_mask": torch.from_numpy(np.array(self._map(shard, "mask", np.uint8)[sl])).bool(),
                "taps": taps.view(self.dtype)}
        if self.topk:
            k = self.topk
            item["topk_logp"] = torch.from_numpy(np.array(self._map(shard, "topk_logp", np.float16, k + 1)[sl]))
            item["topk_ids"] = torch.from_numpy(np.array(self._map(shard, "topk_ids", np.int32, k)[sl])).long()
        return item

    def supervised_tokens(self, i: int) -> torch.Tensor:
        """[n] int64: the loss-masked (response) token ids of sequence i, without reading its taps."""
        return torch.from_numpy(self.tokens(i)).long()[self.loss_mask(i)]

    def __getstate__(self):  # memmaps do not travel to worker processes; they are reopened there
        return {**self.__dict__, "_maps": {}}


def same_tokens_as_cached(root: str, samples: Iterable, name: str, source: str,
                          first_source: str | None = None) -> Iterator:
    """Yields `samples` as they come; ValueError (naming `name`, the cache, and `source`, what holds the
    samples) at the first one whose id cache `root` already holds with other tokens: its conversation was
    edited since, and a resumed cache would keep serving the old features. Ids the cache holds that the
    samples lack are not checked here (one cache may hold the sequences of several files). The cache is read
    when the first sample is asked for, so a writer opened before that has recovered it already.
    `first_source`: the other file the cache was started from, when it was; the message then says that the id
    repeats across the two files instead."""
    cache = FeatureCache(root) if os.path.exists(os.path.join(root, "manifest.json")) else None
    where = {i: n for n, i in enumerate(cache.ids)} if cache is not None else {}
    for s in samples:
        n = where.get(s.id)
        if n is not None and not np.array_equal(cache.tokens(n), np.asarray(s.input_ids, dtype=np.int32)):
            if first_source:
                raise ValueError(f"{name}: holds a sequence {s.id!r} of {first_source} with other tokens than "
                                 f"{source}'s: ids repeat across the two files (a record's line number unless it "
                                 "has an \"id\"); give the records distinct ids, or use another --out")
            raise ValueError(f"{name}: sequence {s.id!r} is cached with other tokens than {source} holds now "
                             "(it was rewritten since); remove the cache folder and run again")
        yield s


def update_manifest(root: str, fields: dict) -> None:
    """Adds `fields` to the cache's manifest.json (atomically), e.g. the data report of the run."""
    path = os.path.join(root, "manifest.json")
    with open(path) as f:
        meta = json.load(f)
    with open(path + ".tmp", "w") as f:
        json.dump({**meta, **fields}, f, indent=1)
    os.replace(path + ".tmp", path)


def cache_features(model: torch.nn.Module, samples: Iterable, root: str, layer_ids: Sequence[int], *,
                   dtype: str = "bf16", meta: dict | None = None, shard_tokens: int = 1 << 20,
                   progress: bool = True, topk: int = 0, batch_tokens: int = 1, window: int = 1) -> int:
    """Runs the target over the samples (objects with .id, .input_ids, .loss_mask) and streams taps to `root`.

    model: an HF causal LM, or an adapter exposing it as `.model`. Samples whose id is already in the
    cache are skipped (resume). Samples are prefilled in batches (`prefill_batches`): windows of `window`
    samples sorted by length, cut into right-padded batches of at most `batch_tokens` padded tokens (a
    longer sample goes alone); causal attention keeps a row's taps independent of the padding after it, so
    a batch gives each sample's unbatched taps up to rounding. The defaults (1, 1) run one sequence at a
    time in the given order; `flashmap features` batches (--batch-tokens, windows of 256). topk > 0 also stores the target's top-`topk`
    next-token log-probabilities per position (soft labels; the LM head runs in the model's dtype, the
    softmax in fp32). The manifest records the target's `target_identity`. Returns the number of sequences
    written by this call. The progress bar counts tokens, so its rate is tokens/s.
    """
    model = hf_causal_lm(model)
    hidden = model.get_input_embeddings().weight.shape[1]
    meta = {**(meta or {}), "target_identity": target_identity(model), "target_layer_ids": list(layer_ids),
            "hidden_size": hidden, "feature_dim": hidden * len(layer_ids), "dtype": dtype,
            **({"topk": int(topk)} if topk else {})}
    written = 0
    with FeatureWriter(root, meta, shard_tokens) as writer, \
            tqdm(desc="features", unit="tok", unit_scale=True, disable=not progress) as bar:
        todo = (s for s in samples if s.id not in writer.done)
        for batch in prefill_batches(todo, batch_tokens, window):
            width = max(len(s.input_ids) for s in batch)
            ids = torch.tensor([list(s.input_ids) + [0] * (width - len(s.input_ids)) for s in batch])
            if topk:
                taps, last = compute_taps(model, ids, layer_ids, final_hidden=True)
            else:
                taps = compute_taps(model, ids, layer_ids)
            for row, s in enumerate(batch):
                t = len(s.input_ids)
                soft = None
                if topk:
                    with torch.inference_mode():
                        soft = topk_logprobs(model.get_output_embeddings()(last[row, :t]), topk)
                writer.add(s.id, s.input_ids, s.loss_mask, taps[row, :t], soft)
                written += 1
                bar.update(t)
            bar.set_postfix(seqs=len(writer.done), refresh=False)
    return written


def prefill_batches(samples: Iterable, batch_tokens: int, window: int) -> Iterator[list]:
    """Batches of `samples` for one padded forward each: every `window` samples sorted by length, then cut
    so that rows x the longest row stays within `batch_tokens` (a sample longer than that goes alone).
    Raises ValueError when batch_tokens or window < 1."""
    if batch_tokens < 1 or window < 1:
        raise ValueError(f"batch_tokens ({batch_tokens}) and window ({window}) must be >= 1")

    def cut(buf):
        batch: list = []
        for s in sorted(buf, key=lambda s: len(s.input_ids)):
            if batch and (len(batch) + 1) * len(s.input_ids) > batch_tokens:
                yield batch
                batch = []
            batch.append(s)
        if batch:
            yield batch
    buf: list = []
    for s in samples:
        buf.append(s)
        if len(buf) == window:
            yield from cut(buf)
            buf = []
    yield from cut(buf)

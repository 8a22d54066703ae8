"""Append-only, resumable jsonl.gz shards for the self-answered corpus (`data/`).

A corpus is a folder of `part-NNNNN.jsonl.gz` files. Each flush appends one complete gzip member (gzip
readers, Python's and `zcat`, read a multi-member file as one stream), then fsyncs, so an interrupted job
loses at most the records of its unfinished flush: `ShardWriter` truncates a torn last member on open. A
part is closed after `records_per_part` records and never written again, so committed parts stay
byte-identical while the newest one grows.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterator

PART = re.compile(r"part-(\d{5})\.jsonl\.gz$")


GZIP_MAGIC = b"\x1f\x8b"


def _good_prefix(path: Path) -> tuple[int, list[bytes]]:
    """(bytes of the complete gzip members at the start of `path`, their decompressed payloads)."""
    data = path.read_bytes()
    good, payloads, start = 0, [], 0
    while start < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            payload = d.decompress(data[start:])
        except zlib.error:
            break
        if not d.eof:
            break
        end = len(data) - len(d.unused_data)
        payloads.append(payload)
        good = start = end
    return good, payloads


def parts(folder: str | Path) -> list[Path]:
    """The corpus parts in `folder`, in order (empty when the folder does not exist)."""
    folder = Path(folder)
    return sorted(p for p in folder.glob("part-*.jsonl.gz") if PART.search(p.name)) if folder.is_dir() else []


def _lines(text: str) -> list[str]:
    """The non-blank JSON lines of a jsonl text, split at "\\n" only: `str.splitlines` also splits at
    U+2028, U+0085, \\x1c… that a record's strings may hold raw (json.dumps with ensure_ascii=False)."""
    return [line for line in text.split("\n") if line.strip()]


def read_records(path: str | Path) -> Iterator[dict]:
    """The records of one corpus folder or one .jsonl.gz / .jsonl file; a torn gzip tail is ignored. ValueError
    for a folder without corpus parts or a .gz file that is not gzip."""
    path = Path(path)
    files = parts(path) if path.is_dir() else [path]
    if not files:
        inner = [d.name for d in sorted(path.glob("*")) if parts(d)] if path.is_dir() else []
        hint = f"; its subfolders {', '.join(inner)} hold some: give one of them" if inner else ""
        raise ValueError(f"{path}: a folder without corpus parts (part-NNNNN.jsonl.gz){hint}")
    for f in files:
        if f.suffix == ".gz":
            with open(f, "rb") as head:
                if head.read(2) not in (GZIP_MAGIC, b""):
                    raise ValueError(f"{f}: not a gzip file")
            payloads = _good_prefix(f)[1]
            text = b"".join(payloads).decode("utf-8")
        else:
            text = f.read_text(encoding="utf-8")
        for n, line in enumerate(_lines(text)):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{f}: record {n} is not JSON ({err})") from None
            yield record


class ShardWriter:
    """Appends records (dicts with an "id") to `folder`/part-NNNNN.jsonl.gz, `flush_every` at a time.

    `done` holds the ids already in the folder (read on open, so a rerun skips them). Raises ValueError for
    records_per_part or flush_every < 1.
    """

    def __init__(self, folder: str | Path, records_per_part: int = 1000, flush_every: int = 16):
        if records_per_part < 1 or flush_every < 1:
            raise ValueError(f"records_per_part ({records_per_part}) and flush_every ({flush_every}) must be >= 1")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.records_per_part, self.flush_every = records_per_part, flush_every
        self.done: set[str] = set()
        self._pending: list[str] = []
        existing = parts(self.folder)
        self._count = 0
        for p in existing:
            good, payloads = _good_prefix(p)
            if good != p.stat().st_size:
                os.truncate(p, good)
            lines = _lines(b"".join(payloads).decode("utf-8"))
            self.done.update(json.loads(line)["id"] for line in lines)
            self._count = len(lines)
        self._index = int(PART.search(existing[-1].name).group(1)) if existing else 0
        if self._count >= records_per_part:
            self._index, self._count = self._index + 1, 0

    @property
    def path(self) -> Path:
        """The part being written."""
        return self.folder / f"part-{self._index:05d}.jsonl.gz"

    def add(self, record: dict) -> None:
        """Queues one record; writes when `flush_every` are queued or the part is full."""
        self._pending.append(json.dumps(record, ensure_ascii=False) + "\n")
        self.done.add(record["id"])
        if len(self._pending) >= self.flush_every or self._count + len(self._pending) >= self.records_per_part:
            self.flush()

    def flush(self) -> None:
        """Writes the queued records as one gzip member and fsyncs; starts a new part when this one is full."""
        while self._pending:
            room = self.records_per_part - self._count
            chunk, self._pending = self._pending[:room], self._pending[room:]
            with open(self.path, "ab") as f:
                f.write(gzip.compress("".join(chunk).encode("utf-8"), mtime=0))
                f.flush()
                os.fsync(f.fileno())
            self._count += len(chunk)
            if self._count >= self.records_per_part:
                self._index, self._count = self._index + 1, 0

    def close(self) -> None:
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def copy_complete(src: str | Path, dst: str | Path) -> int:
    """Copies the complete gzip members of every part of the corpus folder `src` to `dst` (a snapshot of a
    corpus that a running job is still appending to); parts already identical in `dst` are left alone.
    Returns the number of records in `dst`."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for part in parts(src):
        good, payloads = _good_prefix(part)
        with open(part, "rb") as f:
            data = f.read(good)
        out = dst / part.name
        if not out.exists() or out.read_bytes() != data:
            out.write_bytes(data)
        n += len(_lines(b"".join(payloads).decode("utf-8")))
    return n

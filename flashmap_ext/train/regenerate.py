"""Regenerate the responses of a conversations file with the target itself (`flashmap data regenerate`).

What the target would say is what the drafter must predict (DESIGN.md §8: SpecForge and DFlash
train on target-regenerated responses, temperature 0, thinking off for Qwen3-8B). Each conversation is cut
after its last user turn and answered by the target; the output jsonl holds the same `id`, the kept
messages plus the new assistant turn, `enable_thinking` and `finish` ("stop" or "length").

Resumable: the output is appended one batch at a time (flushed and fsynced); a rerun skips ids already in
it and repairs a torn last line left by an interruption.
"""
from __future__ import annotations

import json
import os
import sys
import zlib
from typing import Iterator

import torch
from tqdm.auto import tqdm

from flashmap_ext.checks import check_int
from flashmap_ext.train.data import prompt_ids, read_jsonl, stop_token_ids


def done_ids(out_path: str) -> set[str]:
    """Ids already written to `out_path` (streamed); truncates a torn last line (interrupted write) in place.
    ValueError naming --out for a complete line that is not a record with an "id" (not an earlier output)."""
    ids: set[str] = set()
    if not os.path.exists(out_path):
        return ids
    with open(out_path, "rb") as f:
        good = 0
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            good += len(line)
            if line.strip():
                ids.add(_record_id(line, out_path, number))
    if good != os.path.getsize(out_path):
        os.truncate(out_path, good)
    return ids


# regenerate's keyword behind each recorded setting, and the `flashmap data regenerate` option that sets it
SETTINGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p",
            "seed": "--seed", "enable_thinking": "--thinking"}


def check_settings(out_path: str, settings: dict) -> None:
    """ValueError naming each option whose value differs from the "settings" the first line of an earlier
    output recorded: a resumed file must not mix answers of two recipes (lines without a record: accepted)."""
    if not os.path.exists(out_path):
        return
    with open(out_path, "rb") as f:
        first = f.readline()
    try:
        before = json.loads(first).get("settings") if first.endswith(b"\n") else None
    except ValueError:
        return  # done_ids names the line
    if not isinstance(before, dict):
        return
    changed = [f"{SETTINGS[k]} {settings[k]} (the file's: {before[k]})" for k in SETTINGS
               if k in before and before[k] != settings[k]]
    if changed:
        raise ValueError(f"--out {out_path}: its answers were made with other settings: {'; '.join(changed)}; rerun "
                         "with the file's settings to add the rest, or choose another --out")


def resume_state(out_path: str, settings: dict) -> set[str]:
    """The ids already answered in `out_path`, after refusing a file that is not an earlier output (`done_ids`)
    or one answered with other `settings` (`check_settings`): what a rerun skips. Cheap enough to call before
    the target loads."""
    ids = done_ids(out_path)
    check_settings(out_path, settings)
    return ids


def _record_id(line: bytes, out_path: str, number: int) -> str:
    """The "id" of a line of an earlier output; ValueError naming --out for a line no run of this wrote."""
    try:
        record = json.loads(line)
        return record["id"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--out {out_path}: line {number} is not an answered record with an \"id\" (the file "
                         "holds something else than an earlier run's output); choose another --out") from None


def _prompt_messages(messages: list[dict]) -> list[dict] | None:
    """Messages up to and including the last user turn; None when there is no user turn."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    return None if last is None else list(messages[:last + 1])


def _batches(records: Iterator[dict], skip: set[str], size: int, limit: int | None) -> Iterator[list[dict]]:
    """Batches of the records still to answer; records with no user turn are skipped, counted, and reported
    once on stderr when the records run out."""
    batch, taken, no_user = [], 0, 0
    for record in records:
        if limit is not None and taken >= limit:
            break
        taken += 1
        if record["id"] in skip:
            continue
        msgs = record.get("messages", [])
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise ValueError(f"--data: record {record['id']!r}: 'messages' must be a list of {{role, content}} "
                             f"objects (got {type(msgs).__name__})")
        if _prompt_messages(msgs) is None:
            no_user += 1
            continue
        batch.append(record)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
    if no_user:
        print(f"regenerate: skipped {no_user} record(s) with no user turn (nothing to answer)",
              file=sys.stderr)


@torch.no_grad()
def _generate(model, prompts: list[list[int]], pad_id: int, stops: set[int], max_new_tokens: int,
              temperature: float, top_p: float) -> list[tuple[list[int], bool]]:
    """Left-padded batched HF generate, at most to the model's context (max_position_embeddings). Returns per
    prompt (tokens before the first stop, stopped?)."""
    width = max(map(len, prompts))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)  # answers end there
    if context:
        max_new_tokens = max(1, min(max_new_tokens, context - width))
    out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                         eos_token_id=sorted(stops), **sampling)
    results = []
    for row in out[:, width:].tolist():
        end = next((j for j, t in enumerate(row) if t in stops), None)
        results.append((row if end is None else row[:end], end is not None))
    return results


def regenerate(model, tokenizer, data: str, out: str, *, batch_size: int = 8, max_new_tokens: int = 512,
               temperature: float = 0.0, top_p: float = 1.0, enable_thinking: bool = False, seed: int = 0,
               limit: int | None = None, progress: bool = True) -> int:
    """Answers every conversation of `data` (jsonl) with `model` (an HF causal LM) into `out` (jsonl).

    temperature 0 = greedy; otherwise sampling seeded per batch from (`seed`, first id of the batch).
    `limit` caps the number of input records considered. Returns the number of records written by this
    call (0 when everything was already done). Each line records the call's "settings" (max_new_tokens,
    temperature, top_p, seed, enable_thinking); a rerun into a file made with others is refused
    (`check_settings`). Raises ValueError for batch_size < 1, max_new_tokens < 1, a seed outside [0, 2**32)
    or other settings than the file's, before any model work.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size ({batch_size}) and max_new_tokens ({max_new_tokens}) must be >= 1")
    check_int("seed", seed, 0, 2**32)  # seed·2**32 + crc32(id) seeds torch: 64 bits
    settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "seed": seed,
                "enable_thinking": enable_thinking}
    skip, stops, written = resume_state(out, settings), stop_token_ids(tokenizer), 0
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else min(stops, default=0)
    bar = tqdm(desc="regenerate", unit="conv", disable=not progress)
    for batch in _batches(read_jsonl(data), skip, batch_size, limit):
        prompts = [_prompt_messages(r["messages"]) for r in batch]
        thinking = [bool(r.get("enable_thinking", enable_thinking)) for r in batch]
        tokens = [prompt_ids(tokenizer, p, t) for p, t in zip(prompts, thinking)]
        torch.manual_seed(seed * 2**32 + zlib.crc32(batch[0]["id"].encode()))
        answers = _generate(model, tokens, pad_id, stops, max_new_tokens, temperature, top_p)
        lines = []
        for record, msgs, think, (ids, stopped) in zip(batch, prompts, thinking, answers):
            text = tokenizer.decode(ids, skip_special_tokens=False)
            kept = {"domain": record["domain"]} if "domain" in record else {}  # --domain-weight reads it
            lines.append(json.dumps({"id": record["id"], **kept, "enable_thinking": think, "finish": "stop"
                                     if stopped else "length", "messages": msgs + [{"role": "assistant",
                                                                                    "content": text}],
                                     "settings": settings}, ensure_ascii=False) + "\n")
        with open(out, "a", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        written += len(lines)
        bar.update(len(lines))
    bar.close()
    return written

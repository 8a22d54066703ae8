"""Greedy self-answering with length-bucketed batches that refill finished rows.

`generate_refill` keeps up to `batch_size` conversations decoding together over one HF `DynamicCache`.
When a row ends (stop token or `max_new_tokens`) its slot is freed; once `refill_at` slots are free (or the
batch would otherwise run empty) the next prompts of the queue are prefilled as one left-padded batch and
their KV joins the running batch. Rows are aligned at the right end of the cache: every row's next token
sits at the same column, columns a row does not use are masked out, and leading columns no live row uses
are dropped. Keys are stored after RoPE, so moving a row's KV to other columns changes nothing; its
positions come from `position_ids`, counted per row.

Compared with one `model.generate` per batch (`train/regenerate.py`), no compute is spent on rows that have
finished while the longest one runs on, and the prompt queue is sorted by length in windows so that a
prefill pads little. Output tokens equal per-prompt greedy decoding up to floating-point ties (batched and
padded matmuls round differently; exact in float64, see python_tests/test_data_engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from transformers import DynamicCache

from flashmap_ext.target.model import cache_kwarg


@dataclass
class Job:
    """One prompt to answer. `prompt`: token ids; `key`: anything the caller wants back with the answer."""
    key: object
    prompt: list[int]
    answer: list[int] = field(default_factory=list)
    stopped: bool = False


@dataclass
class EngineStats:
    """Counters of one `generate_refill` call. Token counts are per row, so padding is not counted."""
    prompt_tokens: int = 0
    answer_tokens: int = 0
    decode_steps: int = 0
    row_steps: int = 0        # rows x decode steps, live or not: answer_tokens / row_steps = decode efficiency
    prefills: int = 0
    prefill_padded_tokens: int = 0  # tokens a prefill computed (rows x its width): prompt_tokens / this


def length_sorted(jobs: Iterable[Job], window: int) -> Iterator[Job]:
    """`jobs` re-ordered by prompt length inside consecutive windows of `window` jobs (length buckets that
    keep the stream's order at the coarse scale, so domains stay interleaved)."""
    buf: list[Job] = []
    for job in jobs:
        buf.append(job)
        if len(buf) == window:
            yield from sorted(buf, key=lambda j: len(j.prompt))
            buf = []
    yield from sorted(buf, key=lambda j: len(j.prompt))


def _left_pad(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, seqs))
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    return ids, mask


def _pad_cache_left(cache: DynamicCache, extra: int) -> None:
    if extra <= 0:
        return
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            pad = t.new_zeros(t.shape[0], t.shape[1], extra, t.shape[3])
            setattr(layer, name, torch.cat([pad, t], dim=2))


def _merge(cache: DynamicCache, mask: torch.Tensor, keep: torch.Tensor, new_cache: DynamicCache,
           new_mask: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
    """Rows `keep` of (cache, mask) followed by every row of (new_cache, new_mask), right-aligned; leading
    columns that no row attends to are dropped."""
    if cache is None or keep.numel() == 0:
        cache, mask = new_cache, new_mask
    elif new_cache is not None:
        cache.batch_select_indices(keep)
        mask = mask[keep]
        width = max(mask.shape[1], new_mask.shape[1])
        _pad_cache_left(cache, width - mask.shape[1])
        _pad_cache_left(new_cache, width - new_mask.shape[1])
        mask = torch.cat([mask.new_zeros(mask.shape[0], width - mask.shape[1]), mask], 1)
        new_mask = torch.cat([new_mask.new_zeros(new_mask.shape[0], width - new_mask.shape[1]), new_mask], 1)
        for layer, new in zip(cache.layers, new_cache.layers):
            layer.keys = torch.cat([layer.keys, new.keys], 0)
            layer.values = torch.cat([layer.values, new.values], 0)
        mask = torch.cat([mask, new_mask], 0)
    else:
        cache.batch_select_indices(keep)
        mask = mask[keep]
    used = mask.any(0).nonzero()
    first = int(used[0]) if used.numel() else mask.shape[1]
    if first > 0:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        mask = mask[:, first:]
    return cache, mask


@torch.no_grad()
def _prefill(model, jobs: list[Job], pad: int, stats: EngineStats):
    device = next(model.parameters()).device
    ids, mask = _left_pad([j.prompt for j in jobs], pad, device)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{cache_kwarg(model): cache})
    stats.prefills += 1
    stats.prefill_padded_tokens += ids.numel()
    stats.prompt_tokens += int(mask.sum())
    return cache, mask, out.logits[:, -1].argmax(-1), pos[:, -1] + 1


@torch.no_grad()
def generate_refill(model, jobs: Iterable[Job], *, stop_ids: set[int], pad_id: int, max_new_tokens: int,
                    batch_size: int = 32, refill_at: int = 4,
                    stats: EngineStats | None = None, on_step: Callable[[], None] | None = None) -> Iterator[Job]:
    """Greedy answers for `jobs`, yielded as each finishes (not in input order).

    model: an HF causal LM (`forward(input_ids, attention_mask, position_ids, cache, logits_to_keep)`); jobs: prompts as token ids; stop_ids: end-of-turn ids (the answer excludes the stop
    token, `stopped` says whether one came); max_new_tokens ≥ 1; batch_size ≥ 1 rows decoded together;
    refill_at ≥ 1: free slots that trigger a prefill of new prompts. Raises ValueError on bad sizes.
    """
    if batch_size < 1 or max_new_tokens < 1 or refill_at < 1:
        raise ValueError(f"batch_size ({batch_size}), max_new_tokens ({max_new_tokens}) and refill_at "
                         f"({refill_at}) must be >= 1")
    stats = stats if stats is not None else EngineStats()
    queue = iter(jobs)
    rows: list[Job] = []
    cache = mask = last = pos = None
    exhausted = False

    def finish(job: Job, token: int) -> bool:
        if token in stop_ids:
            job.stopped = True
            return True
        job.answer.append(token)
        stats.answer_tokens += 1
        return len(job.answer) >= max_new_tokens

    while True:
        free = batch_size - len(rows)
        if not exhausted and (free >= min(refill_at, batch_size) or not rows):
            new = []
            for job in queue:
                new.append(job)
                if len(new) == free:
                    break
            exhausted = len(new) < free
            if new:
                new_cache, new_mask, first, new_pos = _prefill(model, new, pad_id, stats)
                keep = torch.arange(len(rows), device=first.device)
                cache, mask = _merge(cache, mask, keep, new_cache, new_mask)
                last = first if last is None or not rows else torch.cat([last, first])
                pos = new_pos if pos is None or not rows else torch.cat([pos, new_pos])
                rows += new
                done = [finish(j, int(t)) for j, t in zip(new, first.tolist())]
                for job, d in zip(new, done):
                    if d:
                        yield job
                if any(done):
                    base = len(rows) - len(new)
                    cache, mask, last, pos, rows = _drop(cache, mask, last, pos, rows, [False] * base + done)
                continue
        if not rows:
            return
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        out = model(input_ids=last[:, None], attention_mask=mask, position_ids=pos[:, None], use_cache=True,
                    **{cache_kwarg(model): cache})
        last, pos = out.logits[:, -1].argmax(-1), pos + 1
        stats.decode_steps += 1
        stats.row_steps += len(rows)
        done = [finish(j, int(t)) for j, t in zip(rows, last.tolist())]
        if on_step is not None:
            on_step()
        if any(done):
            for job, d in zip(rows, done):
                if d:
                    yield job
            cache, mask, last, pos, rows = _drop(cache, mask, last, pos, rows, done)


def _drop(cache, mask, last, pos, rows, done):
    """The batch without the rows flagged in `done` (all None when none is left)."""
    keep = [i for i, d in enumerate(done) if not d]
    if not keep:
        return None, None, None, None, []
    index = torch.tensor(keep, device=last.device, dtype=torch.long)
    cache, mask = _merge(cache, mask, index, None, None)
    return cache, mask, last[index], pos[index], [rows[i] for i in keep]

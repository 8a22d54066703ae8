"""`generate` at batch > 1 (DESIGN.md §7): B prompts of different lengths decoded together, each row as
its solo call would be.

One batch forward per round over [anchor, drafts] of every row; the target's KV cache holds the rows
right-aligned (target/ragged.py: left padding, per-row `position_ids`, `rollback_rows` keeps each row's
accepted prefix) and the drafter's memory holds them left-aligned (`extend_memory` + `truncate`). Row b
drafts k_b = min(K, its remaining budget) tokens, the others' extra slots are −1 (`verify` rejects them
and samples slot k_b with the coin a solo call's bonus uses), and its coins and noise are keyed by its
own seed and positions: at T = 0 a row equals its greedy decoding (fp32), at T > 0 its solo call with its
seed. A row that stopped (stop token or budget) rides along, drafting nothing, until every row has.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashmap_ext import ops
from flashmap_ext.checks import OneSequenceOnly, with_article
from flashmap_ext.request import GenerateOutput, GenerateStats, Request, Timer
from flashmap_ext.target import Target
from flashmap_ext.target.ragged import left_align, left_pad, ragged_inputs, rollback_rows


@dataclass
class Row:
    """One prompt of the batch: its request (seed, budget, stops), committed tokens and stats."""
    req: Request
    stats: GenerateStats
    tokens: list = field(default_factory=list)
    stopped: bool = False

    def budget(self, K: int) -> int:
        """Drafts this round: min(K, the drafts that may still be accepted; the bonus comes on top)."""
        return 0 if self.stopped else max(0, min(K, self.req.max_new_tokens - len(self.tokens) - 1))

    def emit(self, new: list) -> int:
        """Appends up to and including the first stop token and within the budget; returns how many."""
        for i, tok in enumerate(new):
            if tok in self.req.stop:
                new, self.stopped = new[:i + 1], True
                break
        self.tokens.extend(new)
        self.stopped = self.stopped or len(self.tokens) >= self.req.max_new_tokens
        return len(new)


def new_memory(drafter, rows: int, device):
    """drafter.new_memory(rows); a drafter of one sequence at a time is a ValueError naming `input_ids`, the
    prompts that asked for the rows."""
    try:
        return drafter.new_memory(rows, device)
    except OneSequenceOnly as err:
        raise ValueError(f"input_ids: {rows} prompts, but {with_article(err.drafter_name)} drafts one sequence at "
                         f"a time: pass one prompt per generate call") from None


class Batch:
    """The state of a batched call: the target cache, the drafter memory, row lengths, anchors."""

    def __init__(self, target: Target, drafter, prompts: list, rows: list, timer: Timer):
        self.target, self.drafter, self.rows, self.timer = target, drafter, rows, timer
        dev = target.device
        self.tap_ids = () if drafter is None else tuple(drafter.target_layer_ids)
        self.seed = torch.tensor([r.req.seed for r in rows], dtype=torch.int64, device=dev)
        r0 = rows[0].req
        self.sampling = dict(temperature=torch.full((len(rows),), float(r0.temperature), device=dev),
                             top_k=torch.full((len(rows),), min(r0.top_k, 2**31 - 1), dtype=torch.int32, device=dev),
                             top_p=torch.full((len(rows),), float(r0.top_p), device=dev), seed=self.seed,
                             valid_vocab=r0.valid_vocab)
        self.cache = target.new_cache()
        self.memory = None if drafter is None else new_memory(drafter, len(rows), dev)
        if self.memory is not None and not hasattr(self.memory, "truncate"):
            raise ValueError(f"drafter: a list of prompts needs a drafter whose memory holds rows of different "
                             f"lengths (FlashMap, DFlash, EAGLE-3); {with_article(type(drafter).__name__)} does not: generate "
                             f"one prompt at a time")
        self.prefill(prompts)

    def forward(self, block: torch.Tensor, lengths: torch.Tensor, num_logits: int):
        mask, pos = ragged_inputs(lengths, block.shape[1])
        dev = self.target.device
        return self.target.forward(block, self.cache, num_logits=num_logits, tap_layer_ids=self.tap_ids,
                                   attention_mask=mask.to(dev), position_ids=pos.to(dev))

    def prefill(self, prompts: list) -> None:
        t0 = self.timer.now(self.target.device)
        ids, self.lengths = left_pad(prompts, device="cpu")
        ids = ids.to(self.target.device)
        out = self.forward(ids, self.lengths, 1)
        self.anchor = ops.sample(out.logits[:, -1], **self.sampling, position=self.positions(-1))
        if self.memory is not None:
            taps = None if out.taps is None else left_align(out.taps, self.lengths)  # None: no tap layers
            self.drafter.extend_memory(self.memory, left_align(ids, self.lengths), taps)
            self.memory.truncate(self.lengths)
        first, took = self.anchor.tolist(), self.timer.now(self.target.device) - t0
        for row, tok in zip(self.rows, first):
            row.stats.prefill_time_s += took
            if not row.stopped:
                row.emit([tok])

    def positions(self, offset: int = 0) -> torch.Tensor:
        return (self.lengths + offset).to(self.target.device)

    def round(self) -> None:
        """Draft k_b per row → one target forward → `verify` → each row keeps anchor + accepted."""
        dev, timer = self.target.device, self.timer
        t0 = timer.mark("round", dev)
        K = 0 if self.drafter is None else self.drafter.num_draft_tokens
        ks = torch.tensor([r.budget(K) for r in self.rows])
        drafts = self.draft(int(ks.max()), ks)
        t1 = timer.mark("draft", dev)
        k = drafts.shape[1]
        block = torch.cat([self.anchor[:, None], embeddable(drafts, self.target.vocab_size)], dim=1)
        out = self.forward(block, self.lengths + k + 1, k + 1)
        timer.mark("forward", dev)
        res = ops.verify(out.logits, drafts, **self.sampling, position=self.positions(), check=False)
        B = len(self.rows)
        flat = torch.cat([res.num_accepted.long(), res.status.long(), res.tokens.flatten()]).tolist()
        n_acc, status, tokens = flat[:B], flat[B:2 * B], [flat[2 * B + b * (k + 1):2 * B + (b + 1) * (k + 1)] for b in range(B)]
        timer.mark("verify", dev)
        bad = [b for b in range(B) if status[b] & ops.STATUS_ERRORS and not self.rows[b].stopped]
        if bad:
            raise ValueError(f"target logits hold NaN/+inf or no finite value in rows {bad} (verify status "
                             f"{[status[b] for b in bad]})")
        n = torch.tensor(n_acc)
        self.lengths = rollback_rows(self.cache, self.lengths + k + 1, k - n)
        if self.memory is not None:
            self.drafter.extend_memory(self.memory, block, out.taps)
            self.memory.truncate(self.lengths)
        self.anchor = res.tokens.gather(1, n.to(dev)[:, None])[:, 0]
        self.commit(ks.tolist(), n_acc, tokens, t1 - t0, timer.now(dev) - t1)
        timer.mark("commit", dev)

    def draft(self, k: int, ks: torch.Tensor) -> torch.Tensor:
        """[B, k] int64 drafts, row b's slots from ks[b] on −1 (no proposal)."""
        if k == 0:
            return self.anchor.new_empty((len(self.rows), 0))
        drafts = self.drafter.draft(self.memory, self.anchor, num_tokens=k, seed=self.seed, position=self.positions())
        keep = torch.arange(k, device=drafts.device)[None] < ks.to(drafts.device)[:, None]
        return torch.where(keep, drafts.to(torch.int64), -1)

    def commit(self, ks: list, n_acc: list, tokens: list, draft_s: float, verify_s: float) -> None:
        """Each running row records its round (drafted, accepted) and emits accepted + bonus."""
        for row, k, n, toks in zip(self.rows, ks, n_acc, tokens):
            if row.stopped:
                continue
            row.stats.add_round(k, n)
            row.stats.draft_time_s += draft_s
            row.stats.verify_time_s += verify_s
            returned = row.emit(toks[:n + 1])
            if returned < n + 1:  # a stop token: the stats describe exactly the returned tokens
                row.stats.cut_last_round(returned)


def embeddable(drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Drafts with invalid ids (-1, >= V) replaced by 0 for the forward; `verify` rejects those slots."""
    return torch.where((drafts >= 0) & (drafts < vocab_size), drafts, 0)


def generate_rows(target: Target, drafter, prompts: list, requests: list, timer: Timer) -> list:
    """The batched loop over checked prompts ([1, S_b] int64 each) and their Requests: a GenerateOutput
    per row (its tokens and stats; times are the batch's, shared by its rows)."""
    rows = [Row(req, GenerateStats(prompt_tokens=p.shape[1]), stopped=req.max_new_tokens == 0)
            for p, req in zip(prompts, requests)]
    start = timer.now(target.device)
    with torch.inference_mode():
        batch = Batch(target, drafter, [p[0] for p in prompts], rows, timer)
        while not all(r.stopped for r in rows):
            batch.round()
    total = timer.now(target.device) - start
    for row in rows:
        row.stats.new_tokens = len(row.tokens)
        row.stats.total_time_s = total
    return [GenerateOutput(row.tokens, row.stats) for row in rows]

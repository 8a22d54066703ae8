"""Teacher-forced per-slot top-1 accuracy of a drafter on fixed held-out self-answered sequences.

For every scored anchor a of an answer (a committed token whose next K tokens are all answer tokens), the
drafter sees exactly what `speculate.generate` gives it when a is the anchor: its memory holds tokens
0..a-1 with the target's taps at those positions (one teacher-forced target pass over the sequence), and it
drafts K tokens from anchor token a at position a. Slot k is correct when draft k equals token a + k of
the held-out sequence (the target's own greedy answer). At T = 0 a round commits 1 + (leading run of
correct slots) tokens, so the expected acceptance length implied is

    γ = 1 + E_a[ max{ r ≤ K : slots 1..r all correct } ]

(the bonus token included, as in `GenerateStats.acceptance_length`). It depends on the drafter, the data,
K and the dtype: no timing. In bf16 the batch's shape also changes how batched products round, so a near-tie
draft can flip with `batch_size` (a few anchors in hundreds).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch


@dataclass
class HeldoutSequence:
    """One held-out sequence. input_ids / loss_mask: [T] (1 on answer tokens); taps: [T, n_taps * d] of
    the target at `tap_layers` (None until `add_taps`); greedy: [T] target argmax at each position;
    answered_by: the model that wrote the answer (the record's `target` field), None when not recorded."""
    domain: str
    id: str
    input_ids: list[int]
    loss_mask: list[int]
    taps: torch.Tensor | None = None
    tap_layers: tuple[int, ...] = ()
    greedy: list[int] = field(default_factory=list)
    answered_by: str | None = None


def anchors(seq: HeldoutSequence, k: int, stride: int = 1) -> list[int]:
    """Scored anchor positions: a with loss_mask[a..a+k] all 1 (the anchor and its k labels are answer
    tokens), every `stride`-th one counted from the first answer token."""
    mask, n = seq.loss_mask, len(seq.loss_mask)
    first = next((i for i, m in enumerate(mask) if m), n)
    return [a for a in range(first, n - k) if (a - first) % stride == 0 and all(mask[a:a + k + 1])]


@torch.no_grad()
def add_taps(target, seqs: Sequence[HeldoutSequence], layer_ids: Sequence[int]) -> None:
    """Runs the target (a `target.Target`) once over each sequence: stores taps at `layer_ids` (sorted,
    union of every drafter's) and the greedy argmax per position, in place."""
    layer_ids = tuple(sorted(set(int(i) for i in layer_ids)))
    for s in seqs:
        ids = torch.tensor([s.input_ids], device=target.device)
        out = target.forward(ids, target.new_cache(), num_logits=ids.shape[1], tap_layer_ids=layer_ids)
        s.taps = None if out.taps is None else out.taps[0]
        s.tap_layers = layer_ids
        s.greedy = out.logits[0].argmax(-1).tolist()


def _select_taps(s: HeldoutSequence, layer_ids: Sequence[int]) -> torch.Tensor | None:
    """[T, len(layer_ids) * d]: the drafter's taps, in its order, out of the stored union."""
    if not layer_ids:
        return None
    if s.taps is None:
        raise ValueError(f"sequence {s.id!r} has no taps: call add_taps with the drafter's layers first")
    d = s.taps.shape[-1] // len(s.tap_layers)
    missing = [i for i in layer_ids if i not in s.tap_layers]
    if missing:
        raise ValueError(f"taps of layers {missing} were not computed (have {list(s.tap_layers)})")
    return torch.cat([s.taps[:, s.tap_layers.index(i) * d:(s.tap_layers.index(i) + 1) * d] for i in layer_ids], -1)


@torch.no_grad()
def slot_hits(drafter, seqs: Sequence[HeldoutSequence], k: int, *, batch_size: int = 8, stride: int = 1,
              seed: int = 0, device=None, dtype=None) -> list[torch.Tensor]:
    """Per sequence, a [num_anchors, k] bool tensor: slot j of the draft at each scored anchor is correct.

    drafter: any `drafters.common.base.BlockDrafter` with num_draft_tokens ≥ k. Sequences are decoded in batches
    of `batch_size` rows aligned at position 0 (a row past its end is padded and not scored); the memory of
    every row is extended one position at a time exactly as the decoding loop does. Raises ValueError when
    k < 1 or k > drafter.num_draft_tokens.
    """
    if not 1 <= k <= drafter.num_draft_tokens:
        raise ValueError(f"k must be in [1, {drafter.num_draft_tokens}] (the drafter's num_draft_tokens), got {k}")
    scored = [{a: j for j, a in enumerate(anchors(s, k, stride))} for s in seqs]
    hits = [torch.zeros(len(a), k, dtype=torch.bool) for a in scored]
    for i, a, draft in iter_drafts(drafter, seqs, k, batch_size=batch_size, stride=stride, seed=seed, device=device,
                                   dtype=dtype):
        hits[i][scored[i][a]] = draft == torch.tensor(seqs[i].input_ids[a + 1:a + 1 + k])
    return hits


@torch.no_grad()
def iter_drafts(drafter, seqs: Sequence[HeldoutSequence], k: int, *, batch_size: int = 8, stride: int = 1,
                seed: int = 0, device=None, dtype=None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(sequence index, anchor a, draft [k] int64 on the CPU) for every scored anchor of every sequence, the
    drafter seeing what `speculate.generate` gives it at anchor a (module docstring); `seed` is the request seed
    of the drafter's noise. Raises ValueError when k < 1 or k > drafter.num_draft_tokens."""
    if not 1 <= k <= drafter.num_draft_tokens:
        raise ValueError(f"k must be in [1, {drafter.num_draft_tokens}] (the drafter's num_draft_tokens), got {k}")
    for start in range(0, len(seqs), batch_size):
        for i, a, draft in _batch_drafts(drafter, seqs[start:start + batch_size], k, stride, seed, device, dtype):
            yield start + i, a, draft


def _batch_drafts(drafter, seqs, k, stride, seed, device, dtype):
    for rows, memory, anchor, pos, seeds in _anchor_walk(drafter, seqs, k, stride, seed, device, dtype):
        drafts = drafter.draft(memory, anchor, num_tokens=k, seed=seeds, position=pos).cpu()
        for i, a in rows:
            yield i, a, drafts[i, :k]


@torch.no_grad()
def iter_trees(drafters: dict, seqs: Sequence[HeldoutSequence], spec, *, stride: int = 1,
               seed: int = 0) -> Iterator[tuple[int, int, str, object]]:
    """(sequence index, anchor a, name, `DraftTree`) for every scored anchor of every sequence and every tree
    drafter of `drafters` ({name: drafter with `draft_tree`}, all wrapping one block drafter, whose memory they
    share): the tree the tree round (`flashmap_ext/tree.py::tree_draft`) drafts at anchor a with
    `spec` (a TreeSpec, or {name: TreeSpec}), the drafter seeing what `speculate.generate` gives it; batch 1.
    Anchors have spec.depth answer tokens after them. Raises ValueError when a depth is outside [1, K]."""
    specs = spec if isinstance(spec, dict) else dict.fromkeys(drafters, spec)
    first = next(iter(drafters.values()))
    for name, d in drafters.items():
        if not 1 <= specs[name].depth <= d.num_draft_tokens:
            raise ValueError(f"{name}: tree depth must be in [1, {d.num_draft_tokens}] (the drafter's "
                             f"num_draft_tokens), got {specs[name].depth}")
    k = max(s.depth for s in specs.values())
    takes_seed = {name: "seed" in inspect.signature(d.draft_tree).parameters for name, d in drafters.items()}
    for i, s in enumerate(seqs):
        for rows, memory, anchor, pos, seeds in _anchor_walk(first, [s], k, stride, seed, None, None):
            for name, d in drafters.items():
                sp = specs[name]
                seeded = {"seed": seeds} if takes_seed[name] else {}
                tree = d.draft_tree(memory, anchor, pos, depth=sp.depth, topk=sp.topk, num_nodes=sp.num_nodes,
                                    **seeded)
                yield i, rows[0][1], name, tree


def _anchor_walk(drafter, seqs, k, stride, seed, device, dtype):
    """Per anchor position a that some row scores: ([(row, a)], memory, anchor tokens [n], positions [n],
    seeds [n]), the memory of every row holding tokens 0..a−1 with their taps (extended one position at a
    time, as the decoding loop does)."""
    layer_ids = list(drafter.target_layer_ids)
    n, width = len(seqs), max(len(s.input_ids) for s in seqs)
    tokens = torch.zeros(n, width, dtype=torch.long)
    taps = None
    for i, s in enumerate(seqs):
        tokens[i, :len(s.input_ids)] = torch.tensor(s.input_ids)
        t = _select_taps(s, layer_ids)
        if t is not None:
            taps = taps if taps is not None else torch.zeros(n, width, t.shape[-1], dtype=dtype or t.dtype)
            taps[i, :t.shape[0]] = t.to(taps.dtype)
    tokens = tokens.to(device) if device is not None else tokens
    taps = taps.to(device) if taps is not None and device is not None else taps
    scored = [set(anchors(s, k, stride)) for s in seqs]
    first = min((min(a) for a in scored if a), default=None)
    if first is None:
        return
    memory = drafter.new_memory(n, tokens.device)
    drafter.extend_memory(memory, tokens[:, :first], None if taps is None else taps[:, :first])
    seeds = torch.full((n,), seed, dtype=torch.long, device=tokens.device)
    last = max(max(a) for a in scored if a)
    for a in range(first, last + 1):
        if a > first:
            drafter.extend_memory(memory, tokens[:, a - 1:a], None if taps is None else taps[:, a - 1:a])
        rows = [(i, a) for i in range(n) if a in scored[i]]
        if rows:
            pos = torch.full((n,), a, dtype=torch.long, device=tokens.device)
            yield rows, memory, tokens[:, a], pos, seeds


def summarize(hits: Sequence[torch.Tensor], k: int) -> dict:
    """{"anchors", "slot_accuracy" [k] (top-1 accuracy per slot), "gamma" (1 + mean leading run of correct
    slots), "run_histogram" [k + 1] (share of anchors whose run is 0..k)}; None in place of each figure when
    there is no anchor (undefined, and strict JSON: null, never NaN)."""
    h = torch.cat([x.reshape(-1, k) for x in hits]) if hits else torch.zeros(0, k, dtype=torch.bool)
    if h.shape[0] == 0:
        return {"anchors": 0, "slot_accuracy": [None] * k, "gamma": None, "run_histogram": [None] * (k + 1)}
    run = h.long().cumprod(1).sum(1)
    return {"anchors": int(h.shape[0]), "slot_accuracy": h.double().mean(0).tolist(),
            "gamma": 1.0 + float(run.double().mean()),
            "run_histogram": (torch.bincount(run, minlength=k + 1).double() / h.shape[0]).tolist()}


def check_anchors_left(seqs: Sequence[HeldoutSequence], k: int, stride: int, max_length: int | None) -> None:
    """ValueError (one line naming --max-length and --slots) when no sequence has a scored anchor for K = k
    slots (`anchors`): every figure would be undefined."""
    if not any(anchors(s, k, stride) for s in seqs):
        crop = f"within --max-length {max_length} " if max_length is not None else ""
        raise ValueError(f"--max-length: no anchor left to score: no held-out answer keeps {k + 1} answer tokens "
                         f"in a row (an anchor and its K = {k} labels) {crop}in {len(seqs)} sequence(s); raise "
                         f"--max-length or --per-domain, or lower --slots")


def draft_vocab(drafter) -> torch.Tensor | None:
    """[n] int64 target ids the drafter can propose (EAGLE-3 convention: id = row + d2t[row], used by all
    three drafters), or None when it drafts from the whole vocabulary. Looks through `StepsDrafter`."""
    inner = getattr(drafter, "inner", drafter)
    d2t = getattr(inner, "d2t", None)
    if d2t is None:
        return None
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def vocab_coverage(drafter, seqs: Sequence[HeldoutSequence], k: int, stride: int = 1) -> float:
    """Share of the slot-1 labels of the scored anchors that the drafter's draft vocabulary contains (the
    rest can never be accepted); 1.0 for a full-vocabulary drafter, None without an anchor."""
    labels = [s.input_ids[a + 1] for s in seqs for a in anchors(s, k, stride)]
    if not labels:
        return None
    ids = draft_vocab(drafter)
    if ids is None:
        return 1.0
    vocab = set(ids.tolist())
    return sum(t in vocab for t in labels) / len(labels)

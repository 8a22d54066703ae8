"""The lossless speculative decoding loop (DESIGN.md §7), gpt-fast shaped.

    prefill → first token (the first anchor) → repeat {
        draft k tokens → target forward on [anchor, drafts] → `verify` op → commit accepted + bonus →
        roll back the KV of rejected drafts → append the committed positions' taps to the drafter's
        memory → stop checks }

`drafter=None` is the autoregressive baseline through the same loop (k = 0: the verify op is then the
plain sampler). Batch size 1; the ops stay batched. Randomness: the verifier's coins are keyed by
(seed, absolute position), the drafter's noise by its own stream, so a call never depends on an earlier
one. The only host sync in a round is reading the accepted length and the committed tokens, together.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from flashmap_ext import ops
from flashmap_ext.target import Target


@dataclass
class GenerateStats:
    """What one `generate` call did. Times are wall-clock seconds (device-synchronised when `profile`)."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0                                    # target forwards after prefill
    drafted: list = field(default_factory=list)        # draft tokens proposed, per round
    accepted: list = field(default_factory=list)       # drafts accepted, per round (bonus excluded)
    slot_drafted: list = field(default_factory=list)   # [K] rounds in which slot i was proposed
    slot_accepted: list = field(default_factory=list)  # [K] rounds in which slot i was accepted
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0                         # target forward + verify op + commit
    total_time_s: float = 0.0

    @property
    def acceptance_length(self) -> float:
        """γ: mean tokens committed per round, bonus included (1.0 for the AR baseline; nan if no round)."""
        return (sum(self.accepted) + self.rounds) / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of the whole call (prefill included)."""
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else float("nan")

    def summary(self) -> str:
        return (f"{self.new_tokens} tokens in {self.rounds} rounds, γ = {self.acceptance_length:.2f}, "
                f"{self.tokens_per_s:.1f} tokens/s (draft {self.draft_time_s:.3f} s, "
                f"verify {self.verify_time_s:.3f} s, prefill {self.prefill_time_s:.3f} s)")


class GenerateOutput(NamedTuple):
    tokens: list          # the new token ids (prompt excluded); a stop token, if any, is the last one
    stats: GenerateStats


@dataclass
class _Request:
    """Per-call parameters; the sampling ones as the [B] tensors the ops take."""
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    valid_vocab: Optional[int]
    max_new_tokens: int
    stop: frozenset
    on_tokens: Optional[Callable[[list], None]]
    profile: bool

    def sampling(self, position: int) -> dict:
        """Keyword arguments of ops.verify / ops.sample for slot 0 at absolute `position`."""
        pos = torch.full_like(self.seed, position)
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                    position=pos, valid_vocab=self.valid_vocab)


@dataclass
class _State:
    """Mutable state of one call: the target KV holds every committed token except the anchor."""
    cache: object
    memory: object
    anchor: torch.Tensor          # [1] int64, last committed token
    position: int                 # absolute position of the anchor
    tokens: list                  # committed new tokens
    stopped: bool = False


def generate(target, drafter, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, stop_token_ids: Sequence[int] = (), *,
             valid_vocab: Optional[int] = None, on_tokens: Optional[Callable[[list], None]] = None,
             profile: bool = False) -> GenerateOutput:
    """Generates up to `max_new_tokens` tokens after `input_ids`, losslessly.

    Args:
        target: a `Target` or any HF causal LM (wrapped on the fly).
        drafter: a `BlockDrafter` (drafters/base.py), or None for the autoregressive baseline.
        input_ids: the prompt, [S] or [1, S] int64 tensor or a list of ints, 1 <= S.
        max_new_tokens: exact budget (>= 0); fewer tokens only when a stop token is emitted.
        temperature, top_k, top_p: target sampling (T = 0 greedy; top_k 0 / top_p 1 = off).
        seed: request seed of the verifier's (and drafter's) counter-based RNG.
        stop_token_ids: generation ends right after the first of these (it is included).
        valid_vocab: ids >= valid_vocab are padding rows and are never emitted (default: all).
        on_tokens: called with each committed run of new tokens (a list of ints), for streaming.
        profile: synchronise the device around each phase so the stats' times are exact (GPU).
    Returns:
        GenerateOutput(tokens, stats). At T = 0 the tokens equal plain greedy decoding of the target;
        at T > 0 their distribution equals the target's, whatever the drafter.
    Raises:
        ValueError: empty prompt, batch > 1, ids outside the vocabulary, prompt + max_new_tokens
            longer than the target's context, bad sampling parameters, or NaN/+inf target logits.
    """
    target = target if isinstance(target, Target) else Target(target)
    prompt = _check_prompt(target, input_ids, max_new_tokens)
    req = _request(target, temperature, top_k, top_p, seed, valid_vocab, max_new_tokens, stop_token_ids,
                   on_tokens, profile)
    stats = GenerateStats(prompt_tokens=prompt.shape[1])
    if max_new_tokens == 0:
        return GenerateOutput([], stats)
    start = _clock(target.device, profile)
    with torch.inference_mode():
        state = _prefill(target, drafter, prompt, req, stats)
        _emit(state, state.anchor.tolist(), req)
        while not state.stopped:
            _round(target, drafter, state, req, stats)
    stats.new_tokens = len(state.tokens)
    stats.total_time_s = _clock(target.device, profile) - start
    return GenerateOutput(state.tokens, stats)


def _prefill(target: Target, drafter, prompt: torch.Tensor, req: _Request, stats: GenerateStats) -> _State:
    """Runs the prompt through the target, samples the first token, fills the drafter's memory."""
    t0 = _clock(target.device, req.profile)
    cache = target.new_cache()
    out = target.forward(prompt, cache, num_logits=1, tap_layer_ids=_tap_ids(drafter))
    position = prompt.shape[1] - 1
    first = ops.sample(out.logits[:, -1], **req.sampling(position))
    memory = None
    if drafter is not None:
        memory = drafter.new_memory(1, target.device)
        drafter.extend_memory(memory, prompt, out.taps)
    stats.prefill_time_s += _clock(target.device, req.profile) - t0
    return _State(cache, memory, first, position + 1, [])


def _round(target: Target, drafter, state: _State, req: _Request, stats: GenerateStats) -> None:
    """One draft → verify → commit round; commits between 1 and k + 1 tokens."""
    budget = req.max_new_tokens - len(state.tokens) - 1  # drafts that still fit before the budget
    k = 0 if drafter is None else min(drafter.num_draft_tokens, budget)
    t0 = _clock(target.device, req.profile)
    drafts = _draft(drafter, state, k, req.seed)
    t1 = _clock(target.device, req.profile)
    block = torch.cat([state.anchor[:, None], _embeddable(drafts, target.vocab_size)], dim=1)
    out = target.forward(block, state.cache, num_logits=k + 1, tap_layer_ids=_tap_ids(drafter))
    res = ops.verify(out.logits, drafts, **req.sampling(state.position), check=False)
    n_acc, status, *tokens = torch.cat([res.num_accepted.long(), res.status.long(), res.tokens[0]]).tolist()
    if status & ops.STATUS_ERRORS:  # the one host sync of the round is the line above
        raise ValueError(f"target logits hold NaN/+inf or no finite value at positions "
                         f"{state.position}..{state.position + k} (verify status {status})")
    _commit(target, drafter, state, block, out.taps, res.tokens[:, n_acc], n_acc, k)
    stats.draft_time_s += t1 - t0
    stats.verify_time_s += _clock(target.device, req.profile) - t1
    _record(stats, k, n_acc)
    _emit(state, tokens[:n_acc + 1], req)


def _draft(drafter, state: _State, k: int, seed: torch.Tensor) -> torch.Tensor:
    """[1, k] int64 draft tokens (-1 = no proposal); empty for the AR baseline or a zero budget."""
    if drafter is None or k == 0:
        return state.anchor.new_empty((1, 0))
    position = torch.full_like(seed, state.position)
    drafts = drafter.draft(state.memory, state.anchor, num_tokens=k, seed=seed, position=position)
    if drafts.shape != (1, k):
        raise ValueError(f"drafter returned draft_tokens of shape {tuple(drafts.shape)}, expected (1, {k})")
    return drafts.to(torch.int64)


def _embeddable(drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Drafts with invalid ids (-1, >= V) replaced by 0 for the forward; `verify` rejects those slots."""
    return torch.where((drafts >= 0) & (drafts < vocab_size), drafts, 0)


def _commit(target: Target, drafter, state: _State, block: torch.Tensor, taps, bonus: torch.Tensor,
            n_acc: int, k: int) -> None:
    """Keeps anchor + accepted drafts in the KV cache and the drafter memory; bonus = new anchor."""
    target.rollback(state.cache, k - n_acc)
    if drafter is not None:
        kept = None if taps is None else taps[:, :n_acc + 1]
        drafter.extend_memory(state.memory, block[:, :n_acc + 1], kept)
    state.anchor = bonus
    state.position += n_acc + 1


def _emit(state: _State, new: list, req: _Request) -> None:
    """Appends committed tokens up to and including the first stop token; sets `stopped`."""
    for i, tok in enumerate(new):
        if tok in req.stop:
            new, state.stopped = new[:i + 1], True
            break
    state.tokens.extend(new)
    state.stopped = state.stopped or len(state.tokens) >= req.max_new_tokens
    if req.on_tokens is not None and new:
        req.on_tokens(new)


def _record(stats: GenerateStats, k: int, n_acc: int) -> None:
    stats.rounds += 1
    stats.drafted.append(k)
    stats.accepted.append(n_acc)
    grow = max(0, k - len(stats.slot_drafted))
    stats.slot_drafted.extend([0] * grow)
    stats.slot_accepted.extend([0] * grow)
    for i in range(k):
        stats.slot_drafted[i] += 1
        stats.slot_accepted[i] += i < n_acc


def _tap_ids(drafter) -> Sequence[int]:
    return () if drafter is None else tuple(drafter.target_layer_ids)


def _clock(device: torch.device, sync: bool) -> float:
    if sync and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _check_prompt(target: Target, input_ids, max_new_tokens: int) -> torch.Tensor:
    """The prompt as a [1, S] int64 tensor on the target's device, or a ValueError saying why not."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64).to(target.device)
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [S] or [1, S] (batch size 1), got shape {tuple(ids.shape)}")
    S = ids.shape[1]
    if S == 0:
        raise ValueError("empty prompt: generate needs at least one prompt token (e.g. BOS)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    if S + max_new_tokens > target.max_positions:
        raise ValueError(f"prompt too long: {S} prompt tokens + max_new_tokens {max_new_tokens} exceed the "
                         f"target's context of {target.max_positions} positions")
    if int(ids.min()) < 0 or int(ids.max()) >= target.embed_tokens.num_embeddings:
        raise ValueError(f"input_ids must lie in [0, {target.embed_tokens.num_embeddings})")
    return ids


def _request(target: Target, temperature, top_k, top_p, seed, valid_vocab, max_new_tokens, stop_token_ids,
             on_tokens, profile) -> _Request:
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1 "
                         f"(got {temperature}, {top_k}, {top_p})")
    dev = target.device
    return _Request(torch.tensor([temperature], dtype=torch.float32, device=dev),
                    torch.tensor([top_k], dtype=torch.int32, device=dev),
                    torch.tensor([top_p], dtype=torch.float32, device=dev),
                    torch.tensor([seed], dtype=torch.int64, device=dev), valid_vocab, max_new_tokens,
                    frozenset(int(t) for t in stop_token_ids), on_tokens, profile)

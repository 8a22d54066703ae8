"""What the chain round (speculate.py) and the tree round (tree.py) of the decoding loop share: the call's
request and mutable state, the stats, the prompt checks, the prefill, the round driver (timing), the
commit into the drafter's memory and the stop / budget handling (DESIGN.md §7).

A round is two functions: `draft(target, drafter, state, req) -> proposal` and
`verify(target, drafter, state, req, proposal, stats) -> committed tokens`; `verify` leaves the KV cache
holding exactly the committed positions before the new anchor, calls `advance` and records the round.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from flashmap_ext import ops
from flashmap_ext.target import Target


@dataclass
class GenerateStats:
    """What one `generate` call did. Times are wall-clock seconds (device-synchronised when `profile`).

    Chain rounds: slot i = the i-th draft token. Tree rounds: `drafted` counts tree nodes and slot i is
    tree depth i + 1 (proposed when the tree reaches it, accepted when the accepted path does). The stats
    describe exactly the returned tokens: new_tokens = 1 + Σ (accepted + 1) over the rounds; a round cut
    by a stop token counts the drafts before the stop as accepted and the stop as its bonus."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0                                    # target forwards after prefill
    drafted: list = field(default_factory=list)        # draft tokens (tree nodes) proposed, per round
    accepted: list = field(default_factory=list)       # drafts accepted, per round (bonus excluded)
    depths: list = field(default_factory=list)         # slots spanned, per round (chain: drafted; tree: depth)
    slot_drafted: list = field(default_factory=list)   # [K] rounds in which slot i was proposed
    slot_accepted: list = field(default_factory=list)  # [K] rounds in which slot i was accepted
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0                         # target forward + acceptance + commit
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
        gamma = f"{self.acceptance_length:.2f}" if self.rounds else "n/a (no round after prefill)"
        speed = f"{self.tokens_per_s:.1f}" if self.total_time_s > 0 and self.new_tokens else "n/a"
        return (f"{self.new_tokens} tokens in {self.rounds} rounds, γ = {gamma}, "
                f"{speed} tokens/s (draft {self.draft_time_s:.3f} s, "
                f"verify {self.verify_time_s:.3f} s, prefill {self.prefill_time_s:.3f} s)")

    def add_round(self, drafted: int, accepted: int, slots: Optional[int] = None) -> None:
        """Records one round: `drafted` proposals, `accepted` of them committed (bonus excluded), over
        `slots` slots (default `drafted`: a chain; a tree passes its depth)."""
        slots = drafted if slots is None else slots
        self.rounds += 1
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.depths.append(slots)
        self._count_slots(slots, accepted, +1)

    def cut_last_round(self, returned: int) -> None:
        """The last round returned only its first `returned` committed tokens (a stop token ended the
        output there): it is recorded as those tokens alone, the stop in the bonus's place, so
        `accepted` = returned − 1 drafts and the slots past them are neither proposed nor accepted.
        Drafts after the stop never reach the caller and count nowhere but in `drafted` (the cost)."""
        accepted, slots = self.accepted[-1], self.depths[-1]
        if returned - 1 >= accepted:
            return
        self._count_slots(slots, accepted, -1)
        self.accepted[-1] = returned - 1
        self.depths[-1] = min(slots, returned - 1)
        self._count_slots(self.depths[-1], self.accepted[-1], +1)

    def _count_slots(self, slots: int, accepted: int, sign: int) -> None:
        grow = max(0, slots - len(self.slot_drafted))
        self.slot_drafted.extend([0] * grow)
        self.slot_accepted.extend([0] * grow)
        for i in range(slots):
            self.slot_drafted[i] += sign
            self.slot_accepted[i] += sign * (i < accepted)


class GenerateOutput(NamedTuple):
    tokens: list          # the new token ids (prompt excluded); a stop token, if any, is the last one
    stats: GenerateStats


@dataclass
class Request:
    """Per-call parameters: sampling as Python scalars (`scalars`) and as the [1] tensors the ops take."""
    temperature: float
    top_k: int
    top_p: float
    seed: int
    valid_vocab: Optional[int]
    max_new_tokens: int
    stop: frozenset = frozenset()
    on_tokens: Optional[Callable[[list], None]] = None
    profile: bool = False
    device: torch.device = torch.device("cpu")
    on_phase: Optional[Callable[[str], None]] = None

    def __post_init__(self):
        # `not x >= 0` also catches NaN; integers must be integers (a float seed would be truncated)
        if not 0 <= self.temperature < math.inf or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need finite temperature >= 0, top_k >= 0, 0 < top_p <= 1 "
                             f"(got {self.temperature}, {self.top_k}, {self.top_p})")
        for name in ("top_k", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        if not -2**63 <= self.seed < 2**63:
            raise ValueError(f"seed must fit in int64, got {self.seed}")
        dev = self.device
        self.seed_tensor = torch.tensor([self.seed], dtype=torch.int64, device=dev)
        self._tensors = dict(temperature=torch.tensor([self.temperature], dtype=torch.float32, device=dev),
                             top_k=torch.tensor([min(self.top_k, 2**31 - 1)], dtype=torch.int32, device=dev),
                             top_p=torch.tensor([self.top_p], dtype=torch.float32, device=dev),
                             seed=self.seed_tensor)

    def phase(self, name: str) -> None:
        """Tells `on_phase` (a timing seam, e.g. benches/bench_round.py) that a round phase ended."""
        if self.on_phase is not None:
            self.on_phase(name)

    def sampling(self, position: int) -> dict:
        """Keyword arguments of ops.verify / ops.sample for slot 0 at absolute `position`."""
        return dict(self._tensors, position=torch.full_like(self.seed_tensor, position),
                    valid_vocab=self.valid_vocab)

    def scalars(self, vocab_size: int) -> dict:
        """temperature, top_k, top_p, seed, valid_vocab as Python numbers (the tree acceptance's form)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                    valid_vocab=self.valid_vocab or vocab_size)


@dataclass
class State:
    """Mutable state of one call: the target KV holds every committed token except the anchor."""
    cache: object
    memory: object
    anchor: torch.Tensor          # [1] int64, last committed token
    position: int                 # absolute position of the anchor
    tokens: list                  # committed new tokens
    stopped: bool = False

    def draft_budget(self, req: Request) -> int:
        """How many drafts may still be accepted: the bonus always comes on top."""
        return req.max_new_tokens - len(self.tokens) - 1


def check_prompt(target: Target, input_ids, max_new_tokens: int) -> torch.Tensor:
    """The prompt as a [1, S] int64 tensor on the target's device, or a ValueError saying why not."""
    ids = torch.as_tensor(input_ids)
    if ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise TypeError(f"input_ids must be integer token ids, got dtype {ids.dtype}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    ids = ids.to(device=target.device, dtype=torch.int64)
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


def prefill(target: Target, drafter, prompt: torch.Tensor, req: Request, stats: GenerateStats) -> State:
    """Runs the prompt through the target, samples the first token, fills the drafter's memory."""
    t0 = clock(target.device, req.profile)
    cache = target.new_cache()
    out = target.forward(prompt, cache, num_logits=1, tap_layer_ids=tap_ids(drafter))
    position = prompt.shape[1] - 1
    first = ops.sample(out.logits[:, -1], **req.sampling(position))
    memory = None
    if drafter is not None:
        memory = drafter.new_memory(1, target.device)
        drafter.extend_memory(memory, prompt, out.taps)
    stats.prefill_time_s += clock(target.device, req.profile) - t0
    return State(cache, memory, first, position + 1, [])


def run_round(target: Target, drafter, state: State, req: Request, stats: GenerateStats, draft: Callable,
              verify: Callable) -> None:
    """One draft → verify → commit round, timed into `stats`; emits the committed tokens.

    `req.phase` marks: "round" as it starts, "draft" after the draft, "commit" at its end (a chain
    `verify` marks "forward" and "verify" in between)."""
    req.phase("round")
    t0 = clock(target.device, req.profile)
    proposal = draft(target, drafter, state, req)
    t1 = clock(target.device, req.profile)
    req.phase("draft")
    committed = verify(target, drafter, state, req, proposal, stats)
    stats.draft_time_s += t1 - t0
    stats.verify_time_s += clock(target.device, req.profile) - t1
    returned = emit(state, committed, req)
    if returned < len(committed):  # a stop token: the stats describe exactly the returned tokens
        stats.cut_last_round(returned)
    req.phase("commit")


def advance(drafter, state: State, kept_ids: torch.Tensor, kept_taps, bonus: torch.Tensor) -> None:
    """After verification: the kept positions (anchor + accepted drafts, [1, n]) enter the drafter's
    memory; the bonus token [1] becomes the new anchor."""
    if drafter is not None:
        drafter.extend_memory(state.memory, kept_ids, kept_taps)
    state.anchor = bonus
    state.position += kept_ids.shape[1]


def emit(state: State, new: list, req: Request) -> int:
    """Appends committed tokens up to and including the first stop token; sets `stopped`. Returns how
    many of `new` were appended."""
    for i, tok in enumerate(new):
        if tok in req.stop:
            new, state.stopped = new[:i + 1], True
            break
    state.tokens.extend(new)
    state.stopped = state.stopped or len(state.tokens) >= req.max_new_tokens
    if req.on_tokens is not None and new:
        req.on_tokens(new)
    return len(new)


def tap_ids(drafter) -> Sequence[int]:
    return () if drafter is None else tuple(drafter.target_layer_ids)


def clock(device: torch.device, sync: bool) -> float:
    if sync and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()

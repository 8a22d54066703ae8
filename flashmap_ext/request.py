"""The decoding loop's types (DESIGN.md §7): the call's Request, its mutable State, the GenerateStats it
returns, and the one optional Timer of its phases. The loop itself is speculate.py (chain rounds) and
tree.py (tree rounds)."""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import torch

from flashmap_ext.checks import check_int


@dataclass
class GenerateStats:
    """What one `generate` call did. Times are wall-clock seconds (device-synchronised with Timer(sync=True)).

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
    def acceptance_length(self) -> Optional[float]:
        """γ: mean tokens committed per round, bonus included (1.0 for the AR baseline); None when the call ran no
        round after prefill (max_new_tokens 0 or 1, or a stop at the first token), as there is nothing to average."""
        return (sum(self.accepted) + self.rounds) / self.rounds if self.rounds else None

    @property
    def gamma_text(self) -> str:
        """γ to two decimals, or "n/a (no round after prefill)"."""
        return "n/a (no round after prefill)" if self.acceptance_length is None else f"{self.acceptance_length:.2f}"

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of the whole call (prefill included); nan when it returned no token (a
        budget of 0, alone or as one row of a batch: there is no speed to speak of) or took no time."""
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 and self.new_tokens else float("nan")

    def summary(self) -> str:
        speed = "n/a" if math.isnan(self.tokens_per_s) else f"{self.tokens_per_s:.1f}"
        return (f"{self.new_tokens} tokens in {self.rounds} rounds, γ = {self.gamma_text}, "
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
    device: torch.device = torch.device("cpu")

    def __post_init__(self):
        # integers must be integers (a float seed would be truncated); `not x >= 0` also catches NaN
        for name, kind in (("temperature", numbers.Real), ("top_p", numbers.Real), ("top_k", numbers.Integral),
                           ("seed", numbers.Integral)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{name} must be {'an integer' if kind is numbers.Integral else 'a number'}, "
                                f"got {value!r}")
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63) (an int64 Philox key), got {self.seed}")
        if self.valid_vocab is not None:
            self.valid_vocab = check_int("valid_vocab", self.valid_vocab, 1)
        dev = self.device
        self.seed_tensor = torch.tensor([self.seed], dtype=torch.int64, device=dev)
        self._tensors = dict(temperature=torch.tensor([self.temperature], dtype=torch.float32, device=dev),
                             top_k=torch.tensor([min(self.top_k, 2**31 - 1)], dtype=torch.int32, device=dev),
                             top_p=torch.tensor([self.top_p], dtype=torch.float32, device=dev),
                             seed=self.seed_tensor)

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
    tap_ids: tuple = ()           # the drafter's target_layer_ids (() without a drafter)
    stopped: bool = False
    commit: object = None         # the device-side bookkeeping (round_commit.RoundCommit) with cuda_graphs

    def draft_budget(self, req: Request) -> int:
        """How many drafts may still be accepted: the bonus always comes on top."""
        return req.max_new_tokens - len(self.tokens) - 1

    def advance(self, drafter, kept_ids: torch.Tensor, kept_taps, bonus: torch.Tensor) -> None:
        """After verification: the kept positions (anchor + accepted drafts, [1, n]) enter the drafter's
        memory; the bonus token [1] becomes the new anchor."""
        if drafter is not None:
            drafter.extend_memory(self.memory, kept_ids, kept_taps)
        self.anchor = bonus
        self.position += kept_ids.shape[1]

    def emit(self, new: list, req: Request) -> int:
        """Appends committed tokens up to and including the first stop token; sets `stopped`. Returns how
        many of `new` were appended."""
        for i, tok in enumerate(new):
            if tok in req.stop:
                new, self.stopped = new[:i + 1], True
                break
        self.tokens.extend(new)
        self.stopped = self.stopped or len(self.tokens) >= req.max_new_tokens
        if req.on_tokens is not None and new:
            req.on_tokens(new)
        return len(new)


class Timer:
    """The loop's optional timer: `generate(..., timer=Timer(sync=True))` for device-synchronised times
    (GPU) and the split of every round.

    `mark(phase, device)` is called as each round starts ("round") and as each phase ends: "draft", then
    (chain rounds) "forward" (target) and "verify" (op + the host read of its result), then "commit" (KV
    rollback, drafter memory, stats, emit). With cuda_graphs the round's host read comes last: "verify" is
    the op alone and "commit" the device bookkeeping, the read, stats and emit. rounds: per round {phase: ms}; starts: host time (s) of each
    round's start. Without sync, times are host times (kernels may still run on a GPU).
    """

    def __init__(self, sync: bool = False):
        if not isinstance(sync, bool):
            raise TypeError(f"Timer: sync: expected True or False, got {sync!r}")
        self.sync = sync
        self.rounds: list[dict] = []
        self.starts: list[float] = []
        self._last = 0.0

    def now(self, device: torch.device) -> float:
        """Seconds (perf_counter), after a device sync when `sync` and `device` is a GPU."""
        if self.sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def mark(self, phase: str, device: torch.device) -> float:
        """Ends the running phase (or starts a round for "round"); returns the time."""
        now = self.now(device)
        if phase == "round":
            self.starts.append(now)
            self.rounds.append({})
        elif self.rounds:
            self.rounds[-1][phase] = (now - self._last) * 1e3
        self._last = now
        return now

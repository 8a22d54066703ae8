"""A synthetic language with known multi-token structure and an exact next-token distribution (DESIGN.md §13).

A sequence is BOS, a header of `header` distinct tokens drawn uniformly from the header pool (so each header
token names its successor: copying is an induction-head lookup), a body, then EOS. The body
is a string of segments, each chosen in the *free* state (after the header or after a finished segment):

  phrase   marker P_j, then one of set j's alternatives (equal-length token lists, fixed probabilities): the
           multi-token bimodal case. Set kinds cycle through "disjoint" (two modes 0.5/0.5 with disjoint tokens),
           "swap" ([a, b, ...] / [b, a, ...], 0.5/0.5: per-slot marginals tie, their argmax mixes the modes),
           "crossing" ([a, x, ...] 0.3, [a, y, ...] 0.3, [b, z, ...] 0.4: slot-1 argmax is a, slot-2 argmax z,
           an incoherent block) and "skewed" (two modes 0.8/0.2).
  copy     marker C_L (L in 2..max_copy), then header tokens 0..L-1 again: deterministic given the context.
  filler   one token: succ_a(last token) with probability filler_a, else succ_b(last token) (a fixed random
           table): locally predictable.

In the free state the next token is a phrase marker with probability p_phrase (uniform over sets), a copy marker
with probability p_copy (uniform over L), else filler; once the body has `body` tokens the free state emits EOS,
and after EOS only EOS follows. Every prefix determines the generator's state (markers, filler, header and
phrase tokens are disjoint id ranges and a segment's length is fixed by its marker), so `next_probs` is exact.
Everything is a function of `LanguageSpec` (seeded): the same spec gives the same language on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional

BOS, EOS = 0, 1
KINDS = ("disjoint", "swap", "crossing", "skewed")


@dataclass(frozen=True)
class LanguageSpec:
    """The language's parameters. Ids: BOS 0, EOS 1, then header pool, phrase markers, copy markers, filler,
    phrase tokens, in that order (`vocab_size` ids in all)."""
    seed: int = 0
    header: int = 8          # header tokens per sequence (the copy source)
    body: int = 48           # body tokens before the free state emits EOS
    header_pool: int = 32
    num_sets: int = 8        # phrase sets; kinds cycle through KINDS
    max_phrase: int = 8      # phrase lengths cycle through 2..max_phrase
    max_copy: int = 8        # copy lengths 2..max_copy (≤ header)
    filler: int = 64
    phrase_pool: int = 128
    p_phrase: float = 0.2
    p_copy: float = 0.1
    filler_a: float = 0.85

    def __post_init__(self):
        checks = {"header": self.header >= 2, "body": self.body >= 1, "header_pool": self.header_pool >= self.header,
                  "num_sets": self.num_sets >= 1, "max_phrase": 2 <= self.max_phrase <= self.phrase_pool // 3,
                  "max_copy": 2 <= self.max_copy <= self.header, "filler": self.filler >= 2,
                  "p_phrase": 0 <= self.p_phrase and 0 <= self.p_copy and self.p_phrase + self.p_copy < 1,
                  "filler_a": 0 < self.filler_a < 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"LanguageSpec: invalid {bad[0]} ({getattr(self, bad[0])})")


@dataclass(frozen=True)
class PhraseSet:
    kind: str
    alternatives: tuple[tuple[int, ...], ...]
    probs: tuple[float, ...]


@dataclass
class Language:
    """The language of a spec: id ranges, phrase sets, filler table; `next_probs` / `step` are its state machine.

    A state is a hashable tuple: ("free", last_token, body_len), ("phrase", set, alive_mask, offset, body_len),
    ("copy", L, offset, body_len) or ("end",). The header is part of the language (copy source) and is held
    by `Parser` for the copy state."""
    spec: LanguageSpec = field(default_factory=LanguageSpec)

    def __post_init__(self):
        s = self.spec
        self.header_ids = range(2, 2 + s.header_pool)
        self.phrase_markers = range(self.header_ids.stop, self.header_ids.stop + s.num_sets)
        self.copy_markers = range(self.phrase_markers.stop, self.phrase_markers.stop + s.max_copy - 1)  # L = 2..
        self.filler_ids = range(self.copy_markers.stop, self.copy_markers.stop + s.filler)
        self.phrase_ids = range(self.filler_ids.stop, self.filler_ids.stop + s.phrase_pool)
        self.vocab_size = self.phrase_ids.stop
        self._steps: dict = {}
        rng = random.Random(s.seed)
        self.sets = tuple(self._phrase_set(rng, j) for j in range(s.num_sets))
        f = list(self.filler_ids)
        self.succ = [(a, rng.choice([x for x in f if x != a])) for a in (rng.choice(f) for _ in range(self.vocab_size))]

    def _phrase_set(self, rng: random.Random, j: int) -> PhraseSet:
        kind, length = KINDS[j % len(KINDS)], 2 + j % (self.spec.max_phrase - 1)
        toks = rng.sample(list(self.phrase_ids), 3 * length)
        a, b, c = toks[:length], toks[length:2 * length], toks[2 * length:]
        if kind == "disjoint":
            return PhraseSet(kind, (tuple(a), tuple(b)), (0.5, 0.5))
        if kind == "swap":
            return PhraseSet(kind, (tuple(a), tuple([a[1], a[0]] + a[2:])), (0.5, 0.5))
        if kind == "crossing":
            return PhraseSet(kind, (tuple(a), tuple([a[0]] + b[1:]), tuple([b[0]] + c[1:])), (0.3, 0.3, 0.4))
        return PhraseSet(kind, (tuple(a), tuple(b)), (0.8, 0.2))

    def next_probs(self, state, header) -> dict[int, float]:
        """{token: probability} of the next token in `state` (all probabilities > 0, summing to 1)."""
        s = self.spec
        kind = state[0]
        if kind == "end":
            return {EOS: 1.0}
        if kind == "copy":
            return {header[state[2]]: 1.0}
        if kind == "phrase":
            ps = self.sets[state[1]]
            out: dict[int, float] = {}
            alive = [i for i in range(len(ps.alternatives)) if state[2] >> i & 1]
            z = sum(ps.probs[i] for i in alive)
            for i in alive:
                tok = ps.alternatives[i][state[3]]
                out[tok] = out.get(tok, 0.0) + ps.probs[i] / z
            return out
        last, length = state[1], state[2]
        if length >= s.body:
            return {EOS: 1.0}
        out = {m: s.p_phrase / s.num_sets for m in self.phrase_markers}
        out.update({m: s.p_copy / len(self.copy_markers) for m in self.copy_markers})
        a, b = self.succ[last]
        filler = 1.0 - s.p_phrase - s.p_copy
        out[a] = filler * s.filler_a
        out[b] = filler * (1 - s.filler_a)
        return {t: p for t, p in out.items() if p > 0}

    def step(self, state, token: int):
        """The state after `token` (which must have probability > 0 in `state`: see `next_probs`); memoised."""
        key = (state, token)
        if key not in self._steps:
            self._steps[key] = self._step(state, token)
        return self._steps[key]

    def _step(self, state, token: int):
        kind = state[0]
        if kind == "end" or token == EOS:
            return ("end",)
        length = state[-1] + 1
        if kind == "copy":
            return ("copy", state[1], state[2] + 1, length) if state[2] + 1 < state[1] else ("free", token, length)
        if kind == "phrase":
            ps, offset = self.sets[state[1]], state[3]
            mask = sum(1 << i for i in range(len(ps.alternatives))
                       if state[2] >> i & 1 and ps.alternatives[i][offset] == token)
            done = offset + 1 == len(ps.alternatives[0])
            return ("free", token, length) if done else ("phrase", state[1], mask, offset + 1, length)
        if token in self.phrase_markers:
            j = token - self.phrase_markers.start
            return ("phrase", j, (1 << len(self.sets[j].alternatives)) - 1, 0, length)
        if token in self.copy_markers:
            return ("copy", 2 + token - self.copy_markers.start, 0, length)
        return ("free", token, length)


class Parser:
    """The generator's state along one sequence: `states[i]` is the state after tokens[0..i] (None once a
    token had probability 0: an impossible prefix). Raises ValueError when the sequence does not start with
    BOS and a full header."""

    def __init__(self, lang: Language, tokens):
        h = lang.spec.header
        if len(tokens) < h + 1 or tokens[0] != BOS or any(t not in lang.header_ids for t in tokens[1:h + 1]):
            raise ValueError(f"tokens: expected BOS and {h} header ids {lang.header_ids} first")
        self.lang, self.header = lang, tuple(tokens[1:h + 1])
        self._probs: dict = {}
        self.states: list = [None] * h + [("free", self.header[-1], 0)]
        for t in tokens[h + 1:]:
            self.states.append(self.advance(self.states[-1], t))

    def advance(self, state, token: int) -> Optional[tuple]:
        """The state after `token`, None if it has probability 0 (or state is None)."""
        if state is None or token not in self.probs(state):
            return None
        return self.lang.step(state, token)

    def probs(self, state) -> dict[int, float]:
        """`Language.next_probs` of `state` with this sequence's header (memoised: do not modify the dict)."""
        if state not in self._probs:
            self._probs[state] = self.lang.next_probs(state, self.header)
        return self._probs[state]


def sample_sequence(lang: Language, rng: random.Random) -> list[int]:
    """One sequence (BOS … EOS) drawn from the language with `rng`: header uniform without repetition, then `next_probs` step by step."""
    header = rng.sample(list(lang.header_ids), lang.spec.header)
    tokens = [BOS] + header
    parser = Parser(lang, tokens)
    state = parser.states[-1]
    while tokens[-1] != EOS:
        dist = parser.probs(state)
        tok = rng.choices(list(dist), weights=list(dist.values()))[0]
        tokens.append(tok)
        state = lang.step(state, tok)
    return tokens


def sample_corpus(lang: Language, n: int, seed: int) -> list[list[int]]:
    """n sequences from `random.Random(seed)` (deterministic)."""
    rng = random.Random(seed)
    return [sample_sequence(lang, rng) for _ in range(n)]

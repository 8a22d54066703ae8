"""The testbed's measurement: drafters against the exact ceilings on held-out sequences of the language (DESIGN.md §13).

Every scored anchor a of a held-out sequence (body positions with K body tokens after them) is one round: the
drafter sees the target's taps of tokens 0..a−1 and the anchor (evaluate/heldout.iter_drafts, what the decoding
loop gives it) and drafts K tokens; the *language* verifies them (T = 0: the leading run on its greedy chain;
T = 1: Σ_j Π p(d_k | ·), the exact expectation over the verifier's coins). γ = 1 + ΣA / ΣR over rounds, pooled
over prompts, with paired percentile bootstrap intervals over prompts (bench/interval.py). The ideal drafters of
synthetic/ceilings.py are scored on the same anchors.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from flashmap_ext.bench.interval import delta_interval
from flashmap_ext.evaluate.heldout import HeldoutSequence, anchors, iter_drafts
from flashmap_ext.synthetic.ceilings import NAMES, accepted_t0, accepted_t1, anchor_ceilings, greedy_chain, path_probs
from flashmap_ext.synthetic.greedy import greedy_corpus
from flashmap_ext.synthetic.language import Language, Parser, sample_corpus

KINDS = ("all", "bimodal", "forced", "free")
DATA = ("sampled", "greedy")  # what the drafters train and are scored on (`flashmap testbed run --data`)


def heldout_sequences(lang: Language, n: int, seed: int, data: str = "sampled") -> list[HeldoutSequence]:
    """n held-out sequences, the answer (loss) on the body and EOS as in training: `data` "sampled" (samples of
    the language) or "greedy" (synthetic/greedy.py: a sampled prompt, the greedy chain as the answer)."""
    if data not in DATA:
        raise ValueError(f"data: expected one of {DATA}, got {data!r}")
    h = lang.spec.header
    records = greedy_corpus(lang, n, seed) if data == "greedy" else [(s, h + 1) for s in sample_corpus(lang, n, seed)]
    return [HeldoutSequence("synthetic", str(i), s, [0] * c + [1] * (len(s) - c)) for i, (s, c) in enumerate(records)]


def anchor_kind(parser: Parser, state) -> str:
    """'bimodal' (the anchor is a phrase marker: the next token picks an alternative), 'forced' (a copy span or a
    phrase continuation: one possible next token) or 'free'."""
    if state[0] == "phrase" and state[3] == 0:
        return "bimodal"
    if state[0] in ("copy", "phrase") and len(parser.probs(state)) == 1:
        return "forced"
    return "free"


class Tally:
    """Per prompt and anchor kind: rounds R, accepted A at T = 0 / T = 1, and per-slot sums."""

    def __init__(self, prompts: int, k: int):
        self.k = k
        self.rows = [defaultdict(lambda: np.zeros(3 + 2 * k)) for _ in range(prompts)]

    def add(self, prompt: int, kind: str, acc0: float, acc1: float, slots0, slots1) -> None:
        for key in ("all", kind):
            row = self.rows[prompt][key]
            row[:3] += (1.0, acc0, acc1)
            row[3:3 + self.k] += slots0
            row[3 + self.k:] += slots1

    def counts(self, kind: str, t: int) -> np.ndarray:
        """(prompts, 2) [A, R] at T = t for the prompts with rounds of this kind."""
        rows = [r[kind] for r in self.rows if r[kind][0] > 0]
        return np.array([[r[1 + t], r[0]] for r in rows]) if rows else np.zeros((0, 2))

    def gamma(self, kind: str, t: int) -> float:
        c = self.counts(kind, t)
        return 1.0 + c[:, 0].sum() / c[:, 1].sum() if len(c) else float("nan")

    def slot_rates(self, kind: str, t: int) -> list[float]:
        """P(slot j accepted | slots < j accepted), j = 1..K, pooled over rounds."""
        tot = sum((r[kind] for r in self.rows), np.zeros(3 + 2 * self.k))
        run = tot[3 + t * self.k:3 + (t + 1) * self.k]
        prev = np.concatenate([[tot[0]], run[:-1]])
        return [float(x) for x in np.where(prev > 0, run / np.maximum(prev, 1e-300), np.nan)]


def _cumulative(flags) -> np.ndarray:
    return np.cumprod(np.asarray(flags, dtype=np.float64))


def score_drafts(lang: Language, seqs, drafts: dict, k: int) -> Tally:
    """drafts: {(prompt, anchor): [k] ints} → Tally verified by the language."""
    tally = Tally(len(seqs), k)
    parsers = [Parser(lang, s.input_ids) for s in seqs]
    for (i, a), d in drafts.items():
        parser, state = parsers[i], parsers[i].states[a]
        g = greedy_chain(parser, state, k)
        probs = path_probs(parser, state, d)
        tally.add(i, anchor_kind(parser, state), accepted_t0(d, g), accepted_t1(probs),
                  _cumulative([int(x) == y for x, y in zip(d, g)]), _cumulative(probs))
    return tally


def drafter_drafts(drafter, seqs, k: int, stride: int, seed: int = 0) -> dict:
    return {(i, a): [int(x) for x in d] for i, a, d in iter_drafts(drafter, seqs, k, stride=stride, seed=seed)}


def ceiling_tallies(lang: Language, seqs, k: int, stride: int) -> dict[str, Tally]:
    """{ideal drafter name: Tally} on the anchors `drafter_drafts` scores (no per-slot figures)."""
    out = {name: Tally(len(seqs), k) for name in NAMES}
    zeros = np.zeros(k)
    for i, s in enumerate(seqs):
        parser = Parser(lang, s.input_ids)
        for a in anchors(s, k, stride):
            c = anchor_ceilings(parser, parser.states[a], k)
            kind = anchor_kind(parser, parser.states[a])
            for name in NAMES:
                out[name].add(i, kind, c["t0"][name], c["t1"][name], zeros, zeros)
    return out


def gamma_interval(tally: Tally, kind: str, t: int, level: float = 0.95):
    """Percentile bootstrap interval of the pooled γ over prompts (arm 2 of delta_interval fixed at γ = 1)."""
    c = tally.counts(kind, t)
    if len(c) < 2:
        return None
    low, high = delta_interval(np.column_stack([c, np.zeros(len(c)), c[:, 1]]), level=level)
    return (low + 1.0, high + 1.0)


def paired_delta(t1: Tally, t2: Tally, kind: str, t: int, level: float = 0.95):
    """(Δγ = γ₁ − γ₂, interval) over the prompts both tallies have rounds of this kind for (same anchors)."""
    a, b = t1.counts(kind, t), t2.counts(kind, t)
    if len(a) != len(b) or len(a) < 2:
        return float("nan"), None
    counts = np.column_stack([a, b])
    delta = (a[:, 0].sum() + a[:, 1].sum()) / a[:, 1].sum() - (b[:, 0].sum() + b[:, 1].sum()) / b[:, 1].sum()
    return float(delta), delta_interval(counts, level=level)


def draw_diversity(lang: Language, seqs, drafts_by_seed: list[dict]) -> dict:
    """Over several noise draws (one drafts dict per seed): mean distinct drafts per bimodal anchor, the share of
    bimodal anchors with ≥ 2 distinct first tokens, and the share of drafts whose whole block is possible."""
    parsers = [Parser(lang, s.input_ids) for s in seqs]
    distinct, multi, n, possible, total = 0, 0, 0, 0, 0
    for key in drafts_by_seed[0]:
        parser, state = parsers[key[0]], parsers[key[0]].states[key[1]]
        draws = [tuple(d[key]) for d in drafts_by_seed]
        possible += sum(min(path_probs(parser, state, x)) > 0 for x in draws)
        total += len(draws)
        if anchor_kind(parser, state) == "bimodal":
            distinct += len(set(draws))
            multi += len({x[0] for x in draws}) > 1
            n += 1
    return {"draws": len(drafts_by_seed), "bimodal_anchors": n, "distinct_per_bimodal": distinct / max(n, 1),
            "bimodal_with_two_modes": multi / max(n, 1), "possible_blocks": possible / max(total, 1)}

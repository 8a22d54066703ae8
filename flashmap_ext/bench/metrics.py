"""Benchmark metrics over many `generate` calls (DESIGN.md §9), pooled the way the papers pool them.

- γ (acceptance length): tokens committed per target forward, bonus included, pooled over all rounds of
  all prompts: (Σ accepted + rounds) / rounds.
- per-slot conditional acceptance: P(slot i accepted | slots < i accepted and slot i drafted). In a tree
  round slot i is depth i: P(the accepted path reaches depth i | it reached depth i − 1 and the tree
  has depth i); its `drafted` counts tree nodes, its `accepted` is the accepted path's length.
- tokens/s: new tokens / wall time, prefill (and the drafter's prefill) included; speedup = AR time per
  token / method time per token, both measured in the same process on the same prompts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from flashmap_ext.tree import TreeSpec

#: |target logit margin| at a divergence up to which it counts as a numerical near-tie, by target dtype.
#: bf16 logits of magnitude 16–32 are spaced 0.125 apart, so exact ties are common and a 17-token verify
#: forward may round them differently from a 1-token forward; in fp32 only ~1e-4 is numerical noise.
NEAR_TIE = {"fp32": 1e-4, "bf16": 0.25, "fp16": 0.05}


@dataclass
class Record:
    """One method on one prompt turn."""
    method: str
    dataset: str
    prompt_id: str
    tokens: list
    time_s: float
    drafted: list = field(default_factory=list)    # per round: drafts proposed
    accepted: list = field(default_factory=list)   # per round: drafts accepted (bonus excluded)
    draft_time_s: float | None = 0.0               # None: not measured (HF peers time only the whole call)
    verify_time_s: float | None = 0.0
    prefill_time_s: float | None = 0.0
    depths: list = field(default_factory=list)     # per round: slots spanned (tree: its depth); [] = drafted
    identical: bool | None = None                  # T = 0: tokens == AR tokens (None: not checked)
    divergence: dict | None = None                 # first mismatch vs AR: position, margin (see run.py)
    category: str = ""                             # the prompt's category (MT-Bench's eight), else ""


def acceptance_length(records: list[Record]) -> float:
    """Pooled γ; nan for methods without rounds (HF peers)."""
    rounds = sum(len(r.accepted) for r in records)
    return (sum(sum(r.accepted) for r in records) + rounds) / rounds if rounds else math.nan


def slot_acceptance(records: list[Record]) -> list[float]:
    """Conditional acceptance of slot (tree: depth) i, i = 0 … max depth − 1 (nan where never reached)."""
    width = max((d for r in records for d in r.depths or r.drafted), default=0)
    reached, passed = [0] * width, [0] * width
    for r in records:
        for k, a in zip(r.depths or r.drafted, r.accepted):
            for i in range(min(k, a + 1)):  # slot i was judged iff drafted and all before it accepted
                reached[i] += 1
                passed[i] += i < a
    return [p / n if n else math.nan for p, n in zip(passed, reached)]


def committed_histogram(records: list[Record]) -> list[int]:
    """Counts of rounds by tokens committed (index = accepted + 1; index 0 unused)."""
    hist: list[int] = []
    for r in records:
        for a in r.accepted:
            hist.extend([0] * (a + 2 - len(hist)))
            hist[a + 1] += 1
    return hist


def identity(records: list[Record], dtype: str = "fp32") -> str:
    """T = 0 check as a table cell: "yes", "7/8 (1 near-tie)", "6/8 (2 NOT near-ties)" or "n/a"."""
    checked = [r for r in records if r.identical is not None]
    if not checked:
        return "n/a"
    same = sum(r.identical for r in checked)
    if same == len(checked):
        return "yes"
    ties = sum(abs(r.divergence.get("margin", math.inf)) <= NEAR_TIE.get(dtype, 0.0)
               for r in checked if r.divergence)
    other = len(checked) - same - ties
    return f"{same}/{len(checked)}" + (f" ({ties} near-tie{'s' * (ties != 1)})" if ties else "") + \
        (f" ({other} NOT near-ties)" if other else "")


def _total(records: list[Record], key: str) -> float | None:
    """Sum of one time field; None when any record did not measure it."""
    values = [getattr(r, key) for r in records]
    return None if any(v is None for v in values) else sum(values)


def summarize(records: list[Record], ar_records: list[Record] | None, dtype: str = "fp32") -> dict:
    """The row a table shows for one method on one dataset (dtype: of the target, for `identity`)."""
    tokens = sum(len(r.tokens) for r in records)
    time_s = sum(r.time_s for r in records)
    row = {"generations": len(records), "new_tokens": tokens, "time_s": time_s,
           "tokens_per_s": tokens / time_s if time_s > 0 else math.nan,
           "gamma": acceptance_length(records), "slot_acceptance": slot_acceptance(records),
           "committed_histogram": committed_histogram(records),
           **{key: _total(records, key) for key in ("draft_time_s", "verify_time_s", "prefill_time_s")}}
    if ar_records:
        ar_tokens, ar_time = sum(len(r.tokens) for r in ar_records), sum(r.time_s for r in ar_records)
        row["speedup"] = (ar_time / ar_tokens) / (time_s / tokens) if tokens and ar_tokens else math.nan
    row["identical"] = identity(records, dtype)
    row["divergences"] = [dict(r.divergence, prompt_id=r.prompt_id) for r in records if r.divergence]
    return row


def round_costs(spec: list[Record], ar: list[Record]) -> dict:
    """Where a speculative method's time goes, per round, against one AR step (both measured in one process).

    ar_step_s: AR decode time / AR rounds (one 1-token target forward + commit; prefill excluded).
    draft_s, verify_s: the method's draft and verify (K+1-token forward + acceptance + commit) time per round.
    break_even_gamma = (draft_s + verify_s) / ar_step_s: the γ at which a round pays for itself.
    expected_speedup = γ / break_even_gamma (prefill and loop overhead excluded, so it differs a little from
    the measured tokens/s ratio). mean_drafted: drafts verified per round. Values are nan where there are no
    rounds.
    """
    nan = math.nan
    ar_rounds, rounds = sum(len(r.accepted) for r in ar), sum(len(r.accepted) for r in spec)
    ar_step = sum(r.verify_time_s + r.draft_time_s for r in ar) / ar_rounds if ar_rounds else nan
    draft = sum(r.draft_time_s for r in spec) / rounds if rounds else nan
    verify = sum(r.verify_time_s for r in spec) / rounds if rounds else nan
    gamma = acceptance_length(spec)
    break_even = (draft + verify) / ar_step if ar_step > 0 else nan
    return {"ar_step_s": ar_step, "draft_s": draft, "verify_s": verify, "break_even_gamma": break_even,
            "gamma": gamma, "expected_speedup": gamma / break_even if break_even > 0 else nan,
            "mean_drafted": sum(sum(r.drafted) for r in spec) / rounds if rounds else nan}


class Method(NamedTuple):
    """name: table label; drafter: a BlockDrafter, None (AR) or "hf" / "pld" (peers); tree: tree drafting."""
    name: str
    drafter: Any
    tree: TreeSpec | None = None

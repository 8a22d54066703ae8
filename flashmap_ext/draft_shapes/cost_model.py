"""Which draft shape pays on this machine: a cost table, an acceptance profile and the choice.

    round_cost(shape) = draft_s · draft_calls + verify_s(width) + overhead_s       (width = 1 + nodes)
    E[γ](chain of k)  = 1 + Σ_{j=1..k} Π_{i≤j} a_i                                  (a_i: P(slot i accepted | slot i−1 was))
    E[γ](tree)        = 1 + Σ_j P_j,  P_j = Σ_{nodes at depth j} Π_{i≤j} c_i(rank_i)  (block-drafter trees: tree_plan.py)
    E[γ](two branches) = 1 + Σ_j [1 − (1 − P¹_j)(1 − P²_j)]                         (lookup chain + drafter chain/tree, independent)
    rate(shape)       = E[γ] / round_cost;  plain decoding: 1 / (verify_s(1) + overhead_s)

`CostTable` holds measured seconds (draft_shapes/calibrate.py measures and caches them per machine); `Roofline`
gives the same table from bandwidth / FLOP constants, e.g. `H200_QWEN3_8B` for a **projected** H200
speedup. `AcceptanceProfile` keeps per-slot counts with a Beta prior and is updated online from rounds
(`tree_plan.RankProfile` the same per rank, for trees). The shape picked is monotone in the costs: a dearer
width never buys more nodes (for b₁ < b₂ the larger wins iff c₀ΔE ≥ c·(E₁b₂ − E₂b₁) under verify = c₀ + c·w).
Units: seconds; γ = tokens committed per target forward (bonus included).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass
class CostTable:
    """Measured costs: verify_s {width: seconds of one target forward over `width` new tokens, logits for
    all, after `context` tokens}, verify_context_s {width: extra seconds per further context token} (the
    attention and the KV cache grow with the context; {} = not measured, verify costs taken as constant),
    draft_s (one drafter call), memory_s (one drafter memory update per round), overhead_s (the rest of a
    round: acceptance, commit). Widths between measured ones are interpolated linearly, widths beyond the
    largest extrapolated from the last two points; contexts linearly from `context`."""
    verify_s: dict
    draft_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0
    label: str = "measured"
    context: int = 0
    verify_context_s: dict = field(default_factory=dict)

    def __post_init__(self):
        self.verify_s = {int(w): float(t) for w, t in self.verify_s.items()}
        if 1 not in self.verify_s or any(t <= 0 for t in self.verify_s.values()):
            raise ValueError(f"verify_s: needs width 1 and positive seconds, got {self.verify_s}")
        self.verify_context_s = {int(w): float(t) for w, t in self.verify_context_s.items()}
        if any(not t >= 0 for t in self.verify_context_s.values()):
            raise ValueError(f"verify_context_s: needs seconds >= 0 per context token, got {self.verify_context_s}")

    def verify(self, width: int, context: Optional[int] = None) -> float:
        """Seconds of a target forward over `width` (>= 1) tokens after `context` tokens (None: the
        calibration's context)."""
        base = max(_interpolate(self.verify_s, width), min(self.verify_s.values()))
        if context is None or not self.verify_context_s:
            return base
        slope = max(_interpolate(self.verify_context_s, width), 0.0)
        return max(base + slope * (context - self.context), 0.5 * base)

    def plain_s(self, context: Optional[int] = None) -> float:
        """Seconds per token of plain decoding (one width-1 forward, no drafter) after `context` tokens."""
        return self.verify(1, context) + self.overhead_s

    def round_s(self, nodes: int, draft_calls: int = 1, uses_drafter: bool = True,
                context: Optional[int] = None) -> float:
        """Seconds of a round verifying `nodes` draft tokens after `draft_calls` drafter calls."""
        drafter = self.draft_s * draft_calls + self.memory_s if uses_drafter else 0.0
        return drafter + self.verify(1 + nodes, context) + self.overhead_s

    def to_json(self) -> dict:
        return dict(verify_s={str(w): t for w, t in sorted(self.verify_s.items())}, draft_s=self.draft_s,
                    memory_s=self.memory_s, overhead_s=self.overhead_s, label=self.label, context=self.context,
                    verify_context_s={str(w): t for w, t in sorted(self.verify_context_s.items())})

    @classmethod
    def from_json(cls, data: dict) -> "CostTable":
        return cls(**data)


def _interpolate(points: dict, width: int) -> float:
    """points {width: value} at `width`: linear between measured widths, extrapolated from the last two."""
    if width in points:
        return points[width]
    widths = sorted(points)
    if len(widths) == 1:
        return points[widths[0]]
    i = bisect.bisect_left(widths, width)
    lo, hi = (widths[i - 1], widths[i]) if 0 < i < len(widths) else (widths[-2], widths[-1]) if i else widths[:2]
    return points[lo] + (points[hi] - points[lo]) * (width - lo) / (hi - lo)


@dataclass(frozen=True)
class Roofline:
    """Bandwidth / compute-bound costs: verify(w) = max(weights / HBM, 2 · params · w / peak) + launch;
    draft = max(drafter weights / HBM, 2 · drafter params · K / peak) per flow-map step."""
    hbm_bytes_per_s: float
    peak_flops: float
    target_params: float
    drafter_params: float
    bytes_per_param: float = 2.0
    launch_s: float = 20e-6
    draft_block: int = 16
    label: str = "roofline"

    def table(self, steps: int = 1) -> CostTable:
        def forward(params: float, width: int) -> float:
            return max(params * self.bytes_per_param / self.hbm_bytes_per_s, 2 * params * width / self.peak_flops)
        verify = {w: forward(self.target_params, w) + self.launch_s for w in (1, 2, 4, 8, 16, 32, 64)}
        draft = steps * (forward(self.drafter_params, self.draft_block) + self.launch_s)
        return CostTable(verify, draft_s=draft, label=self.label)


#: H200 (HBM3e 4.3 TB/s, ~989 TFLOP/s dense bf16) running Qwen3-8B (8.19 B parameters, bf16)
#: with the FlashMap paper-size drafter (DESIGN.md §5.2: ≈0.5 B trainable + the frozen 151,936 × 4,096 LM head
#: it reads every step ≈ 0.62 B). A projection, never a measurement.
H200_QWEN3_8B = Roofline(hbm_bytes_per_s=4.3e12, peak_flops=989e12, target_params=8.19e9,
                         drafter_params=0.5e9 + 0.62e9, label="projected H200 (roofline: Qwen3-8B bf16, 4.3 TB/s)")


def projected_speedup(gamma: float, mean_nodes: float, table: CostTable, draft_calls: float = 1.0) -> float:
    """Speedup over plain decoding of rounds that commit `gamma` tokens verifying `mean_nodes` drafts after
    `draft_calls` drafter calls, under `table` (e.g. `H200_QWEN3_8B.table()`): γ · plain / round."""
    width = 1 + mean_nodes
    lo, frac = int(width), width - int(width)
    verify = table.verify(lo) * (1 - frac) + table.verify(lo + 1) * frac if frac else table.verify(lo)
    round_s = table.draft_s * draft_calls + table.memory_s + verify + table.overhead_s
    return gamma * table.plain_s() / round_s


@dataclass
class AcceptanceProfile:
    """Per-slot acceptance a_i = P(slot i accepted | slot i−1 accepted), Beta(prior·w, (1−prior)·w) prior
    plus the observed counts (online). `prior` is a per-slot list, or one number for slot 0 with each later
    slot's prior the estimate of the slot before it (so rounds that only ever tried short chains still
    teach the deeper slots, and a chain can grow once its first slots are always accepted)."""
    prior: float | Sequence[float] = 0.5
    weight: float = 4.0
    tried: list = field(default_factory=list)
    accepted: list = field(default_factory=list)

    def rate(self, slot: int) -> float:
        """a_slot (0-based slot)."""
        return self.rates(slot + 1)[slot]

    def rates(self, k: int) -> list:
        """[a_0 … a_{k−1}]."""
        out, prev = [], None
        for slot in range(k):
            if isinstance(self.prior, (int, float)):
                p = self.prior if slot == 0 else prev
            else:
                p = self.prior[slot] if slot < len(self.prior) else self.prior[-1]
            n = self.tried[slot] if slot < len(self.tried) else 0
            a = self.accepted[slot] if slot < len(self.accepted) else 0
            prev = (a + p * self.weight) / (n + self.weight)
            out.append(prev)
        return out

    def record(self, proposed: int, accepted: int) -> None:
        """One chain round: slots 0..proposed−1 were proposed, the first `accepted` accepted (slot
        `accepted`, if proposed, was the first rejected; later slots carry no information)."""
        tried = min(proposed, accepted + 1)
        grow = max(0, tried - len(self.tried))
        self.tried.extend([0] * grow)
        self.accepted.extend([0] * grow)
        for i in range(tried):
            self.tried[i] += 1
            self.accepted[i] += i < accepted

    def reach(self, k: int) -> list:
        """[P_1 … P_k]: probability that the first j slots are all accepted."""
        out, p = [], 1.0
        for a in self.rates(k):
            p *= a
            out.append(p)
        return out

    def expected_gamma(self, k: int) -> float:
        return 1.0 + sum(self.reach(k))

    def decay(self, keep: float) -> None:
        """Multiplies every count by `keep` (0: back to the prior; 1: unchanged)."""
        self.tried = [t * keep for t in self.tried]
        self.accepted = [a * keep for a in self.accepted]


def expected_gamma_two(first: AcceptanceProfile, k1: int, second: AcceptanceProfile, k2: int) -> float:
    """E[γ] of a two-branch tree (chains of k1 and k2 tokens, independent branches)."""
    p1, p2 = first.reach(k1), second.reach(k2)
    return 1.0 + sum(1 - (1 - (p1[j] if j < k1 else 0)) * (1 - (p2[j] if j < k2 else 0)) for j in range(max(k1, k2)))


@dataclass(frozen=True)
class Shape:
    """One round's plan: `lookup` n-gram tokens and/or `drafter` block-drafter nodes (0 = none; a chain
    of that many tokens, or the tree `plan` of `tree_plan.PlanNode`s when one is given), the expected γ
    and seconds of the round under the table."""
    lookup: int
    drafter: int
    gamma: float
    seconds: float
    plan: tuple = ()

    @property
    def rate(self) -> float:
        return self.gamma / self.seconds

    @property
    def nodes(self) -> int:
        return self.lookup + self.drafter


def drafter_plans(drafter, max_depth: int, max_nodes: Optional[int] = None) -> list:
    """[(nodes b, [P(reach depth j + 1) for j < max_depth], plan)] for b = 1, 2, …: chains of b ≤ max_depth
    tokens for an `AcceptanceProfile`; a `RankProfile`'s best trees of b ≤ max_nodes (default max_depth)
    nodes, at most max_depth deep (`tree_plan`)."""
    if max_depth <= 0:
        return []
    if isinstance(drafter, AcceptanceProfile):
        reach = drafter.reach(max_depth)
        return [(k, reach[:k] + [0.0] * (max_depth - k), ()) for k in range(1, max_depth + 1)]
    nodes = drafter.plan(max_depth, max_depth if max_nodes is None else max_nodes)
    out, reach = [], [0.0] * max_depth
    for b, node in enumerate(nodes, start=1):
        reach[node.depth - 1] += node.prob
        out.append((b, list(reach), tuple(nodes[:b])))
    return out


def best_shape(table: CostTable, drafter, max_drafter: int, lookup: Optional[AcceptanceProfile] = None,
               max_lookup: int = 0, two_branch: bool = True, drafter_active: bool = True,
               max_nodes: Optional[int] = None, context: Optional[int] = None) -> Shape:
    """The shape of highest expected tokens/s: plain decoding (0, 0), a lookup chain (l, 0), a drafter
    chain or tree (0, b) or both as two branches (l, b); ties go to the smaller shape. `drafter`: an
    `AcceptanceProfile` (chains of ≤ max_drafter tokens) or a `tree_plan.RankProfile` (its best trees of
    ≤ max_nodes nodes, ≤ max_drafter deep), or None. `drafter_active`: the drafter's memory is kept up to
    date anyway, so a round without drafting still pays `memory_s`. Branches are independent:
    P(reach depth j) = 1 − (1 − P_lookup(j)) · (1 − P_drafter(j)). `context`: the tokens before the
    round's anchor, at which every width is priced (None: the table's calibration context)."""
    memory = table.memory_s if drafter_active else 0.0
    best = Shape(0, 0, 1.0, table.plain_s(context) + memory)
    lookups = range(1, max_lookup + 1) if lookup is not None else ()
    plans = drafter_plans(drafter, max_drafter, max_nodes) if drafter is not None and drafter_active else []
    p1 = lookup.reach(max_lookup) if lookups else []
    cands = [Shape(l, 0, 1 + sum(p1[:l]), table.verify(1 + l, context) + table.overhead_s + memory) for l in lookups]
    cands += [Shape(0, b, 1 + sum(reach), table.round_s(b, context=context), plan) for b, reach, plan in plans]
    if two_branch:
        depth = max(max_lookup, max_drafter)
        for l in lookups:
            first = p1[:l] + [0.0] * (depth - l)
            for b, reach, plan in plans:
                second = reach + [0.0] * (depth - len(reach))
                gamma = 1 + sum(1 - (1 - x) * (1 - y) for x, y in zip(first, second))
                cands.append(Shape(l, b, gamma, table.round_s(l + b, context=context), plan))
    for cand in cands:
        if cand.rate > best.rate * (1 + 1e-9):
            best = cand
    return best

"""Exact acceptance ceilings of ideal drafters on the synthetic language (DESIGN.md §13), per anchor state.

Every drafter of the project is verified as a point mass (the loop passes no draft_probs): draft d_k is accepted
with probability p(d_k | prefix, d_<k) at T = 1 and iff it is the target's argmax at T = 0, up to the first
rejection. With the language itself as the target, the expected accepted length of a draft path is

    T = 0:  max{ r : d_1..d_r equal the greedy chain g_1..g_r }
    T = 1:  Σ_{j=1..K} Π_{k≤j} p(d_k | prefix, d_<k)

and the ideal drafters are: *independent* (slot k from the true marginal m_k(x) = P(x_{t+k} = x | prefix), argmax
per slot or sampled per slot independently) and *joint* (the greedy chain, a sample of the true joint, or the best
point-mass draft). Random drafts are averaged exactly by a forward pass over generator states (paths that reach
the same state merge), so nothing here is sampled.
"""
from __future__ import annotations

from collections import defaultdict

from flashmap_ext.synthetic.language import Parser

NAMES = ("independent_argmax", "independent_sampled", "joint_sampled", "joint_greedy", "joint_best")


def marginals(parser: Parser, state, k: int) -> list[dict[int, float]]:
    """[k] dicts: m_j(x) = P(token j after `state` = x), j = 1..k (float64 sums over merged states)."""
    dist, out = {state: 1.0}, []
    for _ in range(k):
        m: dict[int, float] = defaultdict(float)
        nxt: dict = defaultdict(float)
        for s, w in dist.items():
            for t, p in parser.probs(s).items():
                m[t] += w * p
                nxt[parser.lang.step(s, t)] += w * p
        out.append(dict(m))
        dist = nxt
    return out


def argmax(dist: dict[int, float]) -> int:
    """The most likely token, the lowest id on ties (as torch.argmax and the verifier)."""
    best = max(dist.values())
    return min(t for t, p in dist.items() if p == best)


def greedy_chain(parser: Parser, state, k: int) -> list[int]:
    out = []
    for _ in range(k):
        out.append(argmax(parser.probs(state)))
        state = parser.lang.step(state, out[-1])
    return out


def path_probs(parser: Parser, state, draft) -> list[float]:
    """p(d_j | prefix, d_<j) for j = 1..len(draft); zeros after the first impossible token."""
    out = []
    for t in draft:
        p = 0.0 if state is None else parser.probs(state).get(int(t), 0.0)
        out.append(p)
        state = parser.advance(state, int(t)) if p > 0 else None
    return out


def accepted_t1(probs) -> float:
    """Σ_j Π_{k≤j} p_k: the expected number of accepted point-mass drafts at T = 1."""
    total, run = 0.0, 1.0
    for p in probs:
        run *= p
        total += run
    return total


def accepted_t0(draft, greedy) -> int:
    """The leading run of draft tokens equal to the greedy chain."""
    n = 0
    while n < len(draft) and int(draft[n]) == greedy[n]:
        n += 1
    return n


def _sampled_t1(parser: Parser, state, k: int, weight) -> float:
    """E over random drafts of Σ_j Π p(d_k|·), where the draft's token t at slot j in generator state s has
    probability weight(j, s, t, p(t|s)); only tokens of positive p contribute (a zero ends the product)."""
    dist, total = {state: 1.0}, 0.0
    for j in range(k):
        nxt: dict = defaultdict(float)
        for s, w in dist.items():
            for t, p in parser.probs(s).items():
                nxt[parser.lang.step(s, t)] += w * p * weight(j, s, t, p)
        total += sum(nxt.values())
        dist = nxt
    return total


def _best_t1(parser: Parser, state, k: int, memo: dict) -> float:
    """max over point-mass drafts of Σ_j Π p (exact recursion over states)."""
    if k == 0:
        return 0.0
    key = (state, k)
    if key not in memo:
        memo[key] = max(p * (1.0 + _best_t1(parser, parser.lang.step(state, t), k - 1, memo))
                        for t, p in parser.probs(state).items())
    return memo[key]


def anchor_ceilings(parser: Parser, state, k: int) -> dict[str, dict[str, float]]:
    """{"t0": {name: accepted}, "t1": {name: accepted}} for the NAMES drafters at one anchor state (expected
    accepted drafts, bonus not included: γ = 1 + accepted). At T = 0 the joint drafters all equal the greedy
    chain except joint_sampled (a sample of the joint: accepted while it follows the greedy chain)."""
    m = marginals(parser, state, k)
    g = greedy_chain(parser, state, k)
    ind = [argmax(d) for d in m]
    g_probs = path_probs(parser, state, g)
    t0 = {"independent_argmax": float(accepted_t0(ind, g)),
          "independent_sampled": accepted_t1([m[j].get(g[j], 0.0) for j in range(k)]),
          "joint_sampled": accepted_t1(g_probs), "joint_greedy": float(k), "joint_best": float(k)}
    t1 = {"independent_argmax": accepted_t1(path_probs(parser, state, ind)),
          "independent_sampled": _sampled_t1(parser, state, k, lambda j, s, t, p: m[j].get(t, 0.0)),
          "joint_sampled": _sampled_t1(parser, state, k, lambda j, s, t, p: p),
          "joint_greedy": accepted_t1(g_probs), "joint_best": _best_t1(parser, state, k, {})}
    return {"t0": t0, "t1": t1}

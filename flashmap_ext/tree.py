"""The tree round of the decoding loop (EAGLE-2/3 style draft trees; batch size 1; reference path):
`speculate.generate(..., tree=TreeSpec(depth, topk, num_nodes))`.

Round: the drafter proposes a token tree after the anchor (`drafter.draft_tree`, e.g. EAGLE-3's dynamic
tree) → one target forward over [anchor, nodes] with tree attention (each node sees the committed
context, the anchor and its own ancestors; position = anchor position + depth) → walk the tree from the
anchor (`tree_accept`) → keep the K/V of the accepted path only (cache compaction) → the path's taps
enter the drafter's memory → the bonus token is the next anchor. The prefill, stop and budget handling
are the chain loop's (speculate.py), the types request.py's; the last round's tree is only as deep as the
budget allows.

Acceptance at a node with target distribution p (after temperature / top-k / top-p, the same filter as
`verify`), children x_1 … x_m tried in order (distinct, point-mass drafts): accept x_i iff u_i < p'(x_i),
else set p'(x_i) = 0 and renormalise; if none is accepted, emit a sample of p'. This is sequential
multi-draft speculative sampling (SpecInfer, arXiv:2305.09781 §4.2, with deterministic drafts), so every
emitted token is distributed exactly as under the target; at T = 0 it emits the target's argmax (lowest
id on ties), i.e. greedy decoding. Coins: `rng.verify_uniform(seed, position, stream)`, stream 1 for
the residual sample, 2 + i for the i-th child's accept coin, position = the node's absolute position.
"""
from __future__ import annotations

import inspect

import torch

from flashmap_ext.drafters.common.base import TreeSpec  # noqa: F401  (re-exported: the loop's tree option)
from flashmap_ext.drafters.eagle3.tree import DraftTree
from flashmap_ext.ops.verify_reference import verify_target_probs
from flashmap_ext.request import GenerateStats, Request, State, Timer
from flashmap_ext.rng import STREAM_RESAMPLE, verify_uniform
from flashmap_ext.target import Target


def tree_attention_mask(parents: torch.Tensor, prefix: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask [1, 1, N+1, prefix+N+1] for a forward over [anchor, N nodes] after `prefix` cached
    positions: 0 where visible (context, anchor, ancestors, itself), dtype-min elsewhere."""
    n = parents.shape[0]
    visible = torch.eye(n + 1, dtype=torch.bool)
    visible[:, 0] = True
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            visible[i + 1] |= visible[p + 1]
    visible = torch.cat([torch.ones(n + 1, prefix, dtype=torch.bool), visible], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def _emit_at(logits: torch.Tensor, children: list[tuple[int, int]], sampling: dict, position: int):
    """One node: (accepted child node id, token) or (None, emitted token). children: (node id, token)."""
    valid = sampling["valid_vocab"]
    if sampling["temperature"] == 0:
        best = int(logits[:valid].argmax())
        return next(((c, t) for c, t in children if t == best), (None, best))
    p = verify_target_probs(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"], valid)
    seed = sampling["seed"]
    for i, (c, t) in enumerate(children):
        if verify_uniform(seed, position, 2 + i) < float(p[t]):
            return c, t
        p[t] = 0.0
        p /= p.sum()
    cdf = torch.cumsum(p, 0)
    u = verify_uniform(seed, position, STREAM_RESAMPLE)
    return None, min(int((cdf <= u * float(cdf[-1])).sum()), valid - 1)


def tree_accept(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, position: int,
                sampling: dict) -> tuple[list[int], int]:
    """Walks the tree from the anchor. logits [N+1, V] (row 0 = anchor, row 1+i = node i); tokens,
    parents [N]; position = the anchor's absolute position; sampling: temperature, top_k, top_p, seed,
    valid_vocab. Returns (accepted node ids from the root down, the emitted bonus token)."""
    toks, pars = tokens.tolist(), parents.tolist()
    path, cur = [], -1
    while True:
        children = [(i, toks[i]) for i in range(len(toks)) if pars[i] == cur]
        child, token = _emit_at(logits[cur + 1].double(), children, sampling, position + len(path))
        if child is None:
            return path, token
        path.append(child)
        cur = child


def tree_round(target: Target, drafter, state: State, req: Request, stats: GenerateStats, timer: Timer, *,
               spec: TreeSpec) -> None:
    """One tree round (speculate.chain_round's phases, with "forward" and "verify" inside tree_verify's time)."""
    dev = target.device
    t0 = timer.mark("round", dev)
    tree = tree_draft(target, drafter, state, req, spec)
    t1 = timer.mark("draft", dev)
    committed = tree_verify(target, drafter, state, req, tree, stats)
    stats.draft_time_s += t1 - t0
    stats.verify_time_s += timer.now(dev) - t1
    returned = state.emit(committed, req)
    if returned < len(committed):  # a stop token: the stats describe exactly the returned tokens
        stats.cut_last_round(returned)
    timer.mark("commit", dev)


def tree_draft(target: Target, drafter, state: State, req: Request, spec: TreeSpec) -> DraftTree:
    """The round's draft tree after the anchor, at most as deep as the budget allows (empty at 0)."""
    depth = min(spec.depth, state.draft_budget(req))
    if depth <= 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return DraftTree(empty, empty, empty, empty.float())
    position = torch.tensor([state.position], device=target.device)
    seeded = {"seed": req.seed_tensor} if _takes_seed(drafter) else {}  # block drafters' noise streams
    return drafter.draft_tree(state.memory, state.anchor, position, depth=depth, topk=spec.topk,
                              num_nodes=spec.num_nodes, **seeded)


def _takes_seed(drafter) -> bool:
    return "seed" in inspect.signature(drafter.draft_tree).parameters


def tree_verify(target: Target, drafter, state: State, req: Request, tree: DraftTree,
                stats: GenerateStats) -> list:
    """Target forward over [anchor, nodes] with tree attention → `tree_accept` → keep the accepted path's
    K/V and taps; returns the committed tokens (accepted path + bonus)."""
    dev, pos = target.device, state.position
    tokens, parents, depths = tree.tokens.to(dev), tree.parents.cpu(), tree.depths.to(dev)
    block = torch.cat([state.anchor, tokens])[None]
    positions = (pos + torch.cat([depths.new_zeros(1), depths]))[None]
    mask = tree_attention_mask(parents, pos, target.dtype, dev)
    out = target.forward(block, state.cache, num_logits=block.shape[1], tap_layer_ids=state.tap_ids,
                         attention_mask=mask, position_ids=positions)
    sampling = req.scalars(target.vocab_size)
    _check_logits(out.logits[0], sampling["valid_vocab"], pos)
    path, bonus = tree_accept(out.logits[0], tokens.cpu(), parents, pos, sampling)
    rows = torch.tensor([0] + [1 + i for i in path], device=dev)
    target.keep_positions(state.cache, torch.cat([torch.arange(pos, device=dev), pos + rows]))
    kept_taps = None if out.taps is None else out.taps[:, rows]
    state.advance(drafter, block[:, rows], kept_taps, torch.tensor([bonus], device=dev))
    stats.add_round(len(tokens), len(path), int(depths.max()) if len(tokens) else 0)
    return tokens[path].tolist() + [bonus]


def _check_logits(logits: torch.Tensor, valid_vocab: int, position: int) -> None:
    """ValueError for NaN / +inf logits, or a row without a finite value among the valid ids."""
    valid = logits[:, :valid_vocab]
    if bool(torch.isnan(valid).any() | torch.isposinf(valid).any() | ~torch.isfinite(valid).any(-1).all()):
        raise ValueError(f"target logits hold NaN/+inf or no finite value in the tree round at position "
                         f"{position}")

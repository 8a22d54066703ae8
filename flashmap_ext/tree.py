"""Lossless tree speculative decoding (EAGLE-2/3 style draft trees; batch size 1; reference path).

Round: the drafter proposes a token tree after the anchor (`drafter.draft_tree`, e.g. EAGLE-3's dynamic
tree) → one target forward over [anchor, nodes] with tree attention (each node sees the committed
context, the anchor and its own ancestors; position = anchor position + depth) → walk the tree from the
anchor (`tree_accept`) → keep the K/V of the accepted path only (cache compaction) → the path's taps
enter the drafter's memory → the bonus token is the next anchor.

Acceptance at a node with target distribution p (after temperature / top-k / top-p, the same filter as
`verify`), children x_1 … x_m tried in order (distinct, point-mass drafts): accept x_i iff u_i < p'(x_i),
else set p'(x_i) = 0 and renormalise; if none is accepted, emit a sample of p'. This is sequential
multi-draft speculative sampling (SpecInfer, arXiv:2305.09781 §4.2, with deterministic drafts), so every
emitted token is distributed exactly as under the target; at T = 0 it emits the target's argmax (lowest
id on ties), i.e. greedy decoding. Coins: `reference.verify_uniform(seed, position, stream)`, stream 1 for
the residual sample, 2 + i for the i-th child's accept coin, position = the node's absolute position.
"""
from __future__ import annotations

import torch

from flashmap_ext.reference import verify_target_probs, verify_uniform
from flashmap_ext.speculate import GenerateOutput, GenerateStats, _check_prompt
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
    u = verify_uniform(seed, position, 1)
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


def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keeps cache positions `keep` [n] int64 (ascending) of every layer, in that order (transformers 5.x
    `DynamicCache.layers[i].keys/values` [B, H, L, hd])."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(2, keep.to(layer.keys.device))
        layer.values = layer.values.index_select(2, keep.to(layer.values.device))


def _forward(target: Target, cache, block, positions, mask, tap_ids):
    """Target forward over the tree block; logits for every row and the taps."""
    captured: list = [None] * len(tap_ids)
    with torch.inference_mode(), target._taps(tap_ids, captured):
        out = target.model(input_ids=block, attention_mask=mask, position_ids=positions, use_cache=True,
                           **{target._cache_kwarg: cache})
    return out.logits[0], torch.cat(captured, dim=-1)


def generate_tree(target, drafter, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0, seed: int = 0, stop_token_ids=(), *, depth: int = 7, topk: int = 10,
                  num_nodes: int = 16, valid_vocab: int | None = None) -> GenerateOutput:
    """`speculate.generate` with draft trees: same arguments, contract and outputs (T = 0: identical to
    greedy decoding; T > 0: the target's distribution); `drafter` must offer `draft_tree(memory,
    anchor [1], position [1], depth=, topk=, num_nodes=)` (Eagle3Drafter does). Stats count tree nodes
    as `drafted` and the accepted path length as `accepted`; slot i = tree depth i+1."""
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1 (got {temperature}, {top_k}, {top_p})")
    target = target if isinstance(target, Target) else Target(target)
    prompt = _check_prompt(target, input_ids, max_new_tokens)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                    valid_vocab=valid_vocab or target.vocab_size)
    stats, stop, tokens = GenerateStats(prompt_tokens=prompt.shape[1]), frozenset(stop_token_ids), []
    if max_new_tokens == 0:
        return GenerateOutput(tokens, stats)
    with torch.inference_mode():
        cache, memory, anchor = _prefill(target, drafter, prompt, sampling)
        position, done = prompt.shape[1], _extend(tokens, [anchor], stop, max_new_tokens)
        while not done:
            budget = min(depth, max_new_tokens - len(tokens) - 1)
            path_tokens = _tree_round(target, drafter, cache, memory, anchor, position, budget,
                                      dict(topk=topk, num_nodes=num_nodes), sampling, stats)
            position += len(path_tokens)
            anchor = path_tokens[-1]
            done = _extend(tokens, path_tokens, stop, max_new_tokens)
    stats.new_tokens = len(tokens)
    return GenerateOutput(tokens, stats)


def _prefill(target: Target, drafter, prompt: torch.Tensor, sampling: dict):
    cache = target.new_cache()
    out = target.forward(prompt, cache, num_logits=1, tap_layer_ids=tuple(drafter.target_layer_ids))
    _, first = _emit_at(out.logits[0, -1].double(), [], sampling, prompt.shape[1] - 1)
    memory = drafter.new_memory(1, target.device)
    drafter.extend_memory(memory, prompt, out.taps)
    return cache, memory, first


def _tree_round(target: Target, drafter, cache, memory, anchor: int, position: int, depth: int,
                shape: dict, sampling: dict, stats: GenerateStats) -> list[int]:
    """One round; returns the committed tokens (accepted path + bonus)."""
    dev = target.device
    anchor_t, pos_t = torch.tensor([anchor], device=dev), torch.tensor([position], device=dev)
    if depth > 0:
        tree = drafter.draft_tree(memory, anchor_t, pos_t, depth=depth, **shape)
        tokens, parents, depths = tree.tokens.to(dev), tree.parents, tree.depths.to(dev)
    else:
        tokens = parents = depths = torch.zeros(0, dtype=torch.long, device=dev)
    block = torch.cat([anchor_t, tokens])[None]
    positions = (position + torch.cat([depths.new_zeros(1), depths]))[None]
    mask = tree_attention_mask(parents.cpu(), position, target.dtype, dev)
    logits, taps = _forward(target, cache, block, positions, mask, tuple(drafter.target_layer_ids))
    path, bonus = tree_accept(logits, tokens.cpu(), parents.cpu(), position, sampling)
    rows = torch.tensor([0] + [1 + i for i in path], device=dev)
    keep_positions(cache, torch.cat([torch.arange(position, device=dev), position + rows]))
    drafter.extend_memory(memory, block[:, rows], taps[:, rows])
    _record(stats, depths.tolist(), len(path))
    return tokens[path].tolist() + [bonus]


def _extend(tokens: list, new: list, stop, max_new_tokens: int) -> bool:
    """Appends `new` up to and including the first stop token; True when generation is over."""
    for i, t in enumerate(new):
        if t in stop:
            tokens.extend(new[:i + 1])
            return True
    tokens.extend(new)
    return len(tokens) >= max_new_tokens


def _record(stats: GenerateStats, depths: list, accepted: int) -> None:
    stats.rounds += 1
    stats.drafted.append(len(depths))
    stats.accepted.append(accepted)
    levels = max(depths, default=0)
    grow = max(0, levels - len(stats.slot_drafted))
    stats.slot_drafted.extend([0] * grow)
    stats.slot_accepted.extend([0] * grow)
    for i in range(levels):
        stats.slot_drafted[i] += 1
        stats.slot_accepted[i] += i < accepted

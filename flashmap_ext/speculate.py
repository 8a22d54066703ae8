"""The lossless speculative decoding loop (DESIGN.md §7), gpt-fast shaped.

    prefill → first token (the first anchor) → repeat {
        draft k tokens → target forward on [anchor, drafts] → `verify` op → commit accepted + bonus →
        roll back the KV of rejected drafts → append the committed positions' taps to the drafter's
        memory → stop checks }

With `tree=TreeSpec(depth, topk, num_nodes)` the round drafts a token tree instead (EAGLE-3's
`draft_tree`; tree attention, multi-draft acceptance and KV compaction in tree.py). The request, state,
stats, prefill and stop handling shared by both rounds are in loop.py.

`drafter=None` is the autoregressive baseline through the same loop (k = 0: the verify op is then the
plain sampler). Batch size 1; the ops stay batched. Randomness: the verifier's coins are keyed by
(seed, absolute position), the drafter's noise by its own stream, so a call never depends on an earlier
one. The only host sync in a round is reading the accepted length and the committed tokens, together.
"""
from __future__ import annotations

import functools
import numbers
from typing import Callable, Optional, Sequence

import torch

from flashmap_ext import ops
from flashmap_ext.loop import (GenerateOutput, GenerateStats, Request, State, advance, check_prompt, clock,
                               emit, prefill, run_round, tap_ids)
from flashmap_ext.target import Target
from flashmap_ext.tree import TreeSpec, tree_draft, tree_verify

__all__ = ["generate", "generate_tree", "GenerateOutput", "GenerateStats", "TreeSpec"]


def generate(target, drafter, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, stop_token_ids: Sequence[int] = (), *,
             tree: Optional[TreeSpec] = None, valid_vocab: Optional[int] = None,
             on_tokens: Optional[Callable[[list], None]] = None, profile: bool = False,
             on_phase: Optional[Callable[[str], None]] = None) -> GenerateOutput:
    """Generates up to `max_new_tokens` tokens after `input_ids`, losslessly.

    Args:
        target: a `Target` or any HF causal LM (wrapped on the fly).
        drafter: a `BlockDrafter` (drafters/base.py), or None for the autoregressive baseline.
        input_ids: the prompt, [S] or [1, S] int64 tensor or a list of ints, 1 <= S.
        max_new_tokens: exact budget (>= 0); fewer tokens only when a stop token is emitted.
        temperature, top_k, top_p: target sampling (T = 0 greedy; top_k 0 / top_p 1 = off).
        seed: request seed of the verifier's (and drafter's) counter-based RNG.
        stop_token_ids: generation ends right after the first of these (it is included); a single id
            or None also work.
        tree: None (chain drafting) or a `TreeSpec(depth, topk, num_nodes)`: tree drafting, which needs a
            drafter with `draft_tree` (Eagle3Drafter); batch 1, reference acceptance path.
        valid_vocab: ids >= valid_vocab are padding rows and are never emitted (default: all).
        on_tokens: called with each committed run of new tokens (a list of ints), for streaming.
        profile: synchronise the device around each phase so the stats' times are exact (GPU).
        on_phase: a timing seam, called with "round" as each round starts and with the phase that just
            ended: "draft", then (chain rounds) "forward" (target) and "verify" (op + the host read of
            its result), then "commit" (KV rollback, drafter memory, stats, emit). It may synchronise.
    Returns:
        GenerateOutput(tokens, stats). At T = 0 the tokens equal plain greedy decoding of the target;
        at T > 0 their distribution equals the target's, whatever the drafter.
    Raises:
        ValueError: empty prompt, batch > 1, ids outside the vocabulary, prompt + max_new_tokens
            longer than the target's context, bad sampling parameters, NaN/+inf target logits, or a
            tree without a tree drafter.
    """
    target = target if isinstance(target, Target) else Target(target)
    prompt = check_prompt(target, input_ids, max_new_tokens)
    req = Request(temperature, top_k, top_p, seed, valid_vocab, max_new_tokens,
                  _stop_set(stop_token_ids), on_tokens, profile, target.device, on_phase)
    draft, verify = _round_functions(drafter, tree)
    stats = GenerateStats(prompt_tokens=prompt.shape[1])
    if max_new_tokens == 0:
        return GenerateOutput([], stats)
    start = clock(target.device, profile)
    with torch.inference_mode():
        state = prefill(target, drafter, prompt, req, stats)
        emit(state, state.anchor.tolist(), req)
        while not state.stopped:
            run_round(target, drafter, state, req, stats, draft, verify)
    stats.new_tokens = len(state.tokens)
    stats.total_time_s = clock(target.device, profile) - start
    return GenerateOutput(state.tokens, stats)


def generate_tree(target, drafter, input_ids, max_new_tokens: int, *args, depth: int = 7, topk: int = 10,
                  num_nodes: int = 16, **kwargs) -> GenerateOutput:
    """`generate(..., tree=TreeSpec(depth, topk, num_nodes))`; defaults: the DFlash paper's 7, 10, 16."""
    return generate(target, drafter, input_ids, max_new_tokens, *args,
                    tree=TreeSpec(depth, topk, num_nodes), **kwargs)


def _stop_set(stop_token_ids) -> frozenset:
    """stop_token_ids as a frozenset of ints: None = none, a single id (int or 0-d tensor) = that one."""
    if stop_token_ids is None:
        return frozenset()
    if isinstance(stop_token_ids, numbers.Integral) or (isinstance(stop_token_ids, torch.Tensor)
                                                        and stop_token_ids.dim() == 0):
        return frozenset([int(stop_token_ids)])
    return frozenset(int(t) for t in stop_token_ids)


def _round_functions(drafter, tree: Optional[TreeSpec]) -> tuple[Callable, Callable]:
    """(draft, verify) of the chain round, or of the tree round for `tree`."""
    if tree is None:
        return _chain_draft, _chain_verify
    if not isinstance(tree, TreeSpec):
        raise ValueError(f"tree must be a TreeSpec(depth, topk, num_nodes), got {tree!r}")
    if not hasattr(drafter, "draft_tree"):
        raise ValueError(f"tree decoding needs a drafter with draft_tree (e.g. Eagle3Drafter), "
                         f"got {type(drafter).__name__}")
    return functools.partial(tree_draft, spec=tree), tree_verify


def _chain_draft(target: Target, drafter, state: State, req: Request) -> torch.Tensor:
    """[1, k] int64 draft tokens (-1 = no proposal); empty for the AR baseline or a zero budget."""
    k = 0 if drafter is None else min(drafter.num_draft_tokens, state.draft_budget(req))
    if k == 0:
        return state.anchor.new_empty((1, 0))
    position = torch.full_like(req.seed_tensor, state.position)
    drafts = drafter.draft(state.memory, state.anchor, num_tokens=k, seed=req.seed_tensor, position=position)
    if drafts.dim() != 2 or drafts.shape[0] != 1 or drafts.shape[1] > k:  # fewer: e.g. a short n-gram match
        raise ValueError(f"drafter returned draft_tokens of shape {tuple(drafts.shape)}, expected (1, n <= {k})")
    return drafts.to(torch.int64)


def _chain_verify(target: Target, drafter, state: State, req: Request, drafts: torch.Tensor,
                  stats: GenerateStats) -> list:
    """Target forward on [anchor, drafts] → `verify` op → keep anchor + accepted; returns the committed
    tokens (accepted drafts + bonus)."""
    k = drafts.shape[1]
    block = torch.cat([state.anchor[:, None], _embeddable(drafts, target.vocab_size)], dim=1)
    out = target.forward(block, state.cache, num_logits=k + 1, tap_layer_ids=tap_ids(drafter))
    req.phase("forward")
    res = ops.verify(out.logits, drafts, **req.sampling(state.position), check=False)
    n_acc, status, *tokens = torch.cat([res.num_accepted.long(), res.status.long(), res.tokens[0]]).tolist()
    req.phase("verify")
    if status & ops.STATUS_ERRORS:  # the one host sync of the round is the line above
        raise ValueError(f"target logits hold NaN/+inf or no finite value at positions "
                         f"{state.position}..{state.position + k} (verify status {status})")
    target.rollback(state.cache, k - n_acc)
    kept_taps = None if out.taps is None else out.taps[:, :n_acc + 1]
    advance(drafter, state, block[:, :n_acc + 1], kept_taps, res.tokens[:, n_acc])
    stats.add_round(k, n_acc)
    return tokens[:n_acc + 1]


def _embeddable(drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Drafts with invalid ids (-1, >= V) replaced by 0 for the forward; `verify` rejects those slots."""
    return torch.where((drafts >= 0) & (drafts < vocab_size), drafts, 0)

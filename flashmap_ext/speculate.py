"""The lossless speculative decoding loop (DESIGN.md §7), gpt-fast shaped:

    generate → prefill (first token = first anchor) → repeat { round: draft k tokens → target forward on
    [anchor, drafts] → `verify` op → roll back the KV of rejected drafts → commit accepted + bonus (their
    taps enter the drafter's memory) → stop checks }

With `tree=TreeSpec(depth, topk, num_nodes)` the round drafts a token tree instead (tree.py: tree attention,
multi-draft acceptance, KV compaction). The request, state, stats and timer types are in request.py.

`drafter=None` is the autoregressive baseline through the same loop (k = 0: the verify op is then the
plain sampler). One prompt runs here; a list of prompts runs as one batch in batched.py, each row as its
own call would (inputs.py says which forms of prompt `generate` takes). Randomness: the verifier's coins are keyed by
(seed, absolute position), the drafter's noise by its own stream, so a call never depends on an earlier
one. The only host sync in a round is reading the accepted length and the committed tokens, together.
With `cuda_graphs` the rounds are `static_round`: the bookkeeping after verify runs on the device before that
read (round_commit.py), as CUDA graphs on a GPU.
"""
from __future__ import annotations

import functools
import numbers
import warnings
from typing import Callable, Optional, Sequence

import torch

from flashmap_ext import ops
from flashmap_ext.batched import embeddable, generate_rows
from flashmap_ext.drafters.common.base import TargetMismatch
from flashmap_ext.inputs import as_ids, as_prompts
from flashmap_ext.request import GenerateOutput, GenerateStats, Request, State, Timer
from flashmap_ext.round_commit import RoundCommit
from flashmap_ext.target import Target
from flashmap_ext.target.static import StaticTarget, static_target_for
from flashmap_ext.tree import TreeSpec, tree_round

__all__ = ["generate", "GenerateOutput", "GenerateStats", "TreeSpec", "Timer"]

#: what `cuda_graphs` runs (the refusal of a tree or a batch, here and on the CLI)
CUDA_GRAPHS_SHAPES = "the static target runs chain rounds of one prompt (no tree, no batch)"


def generate(target, drafter, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, stop_token_ids: Sequence[int] = (), *,
             tree: Optional[TreeSpec] = None, valid_vocab: Optional[int] = None,
             on_tokens: Optional[Callable[[list], None]] = None, timer: Optional[Timer] = None,
             cuda_graphs: bool = False) -> GenerateOutput:
    """Generates up to `max_new_tokens` tokens after `input_ids`, losslessly.

    Args:
        target: a `Target` or any HF causal LM (wrapped on the fly).
        drafter: a `BlockDrafter` (drafters/common/base.py), or None for the autoregressive baseline.
        input_ids: the prompt: an [S] or [1, S] integer tensor or a list of ints, 1 <= S, or a tokenizer's
            output as is (`tokenizer(text)`, `apply_chat_template(..., return_tensors="pt")`, a
            `tokenizers.Encoding`; its attention_mask drops padding). Or B prompts: a list of them (each a
            list of ints, an [S_b] tensor or a tokenizer output; lengths may differ) or a tokenizer's
            output over B texts (`tokenizer(texts)`, B = 1 included; a [1, S] tensor is one prompt): one batch
            (batched.py), a list of B GenerateOutputs back, row b as its own call with `seed[b]`,
            `max_new_tokens[b]`.
        max_new_tokens: exact budget (>= 0); fewer tokens only when a stop token is emitted. A batch
            takes an int or one per prompt (as does `seed`).
        temperature, top_k, top_p: target sampling (T = 0 greedy; top_k 0 / top_p 1 = off).
        seed: request seed of the verifier's (and drafter's) counter-based RNG.
        stop_token_ids: generation ends right after the first of these (it is included); ids in
            [0, target.vocab_size); a single id or None also work.
        tree: None (chain drafting) or a `TreeSpec(depth, topk, num_nodes)`: tree drafting, which needs a
            drafter with `draft_tree` (Eagle3Drafter, or a LookupDrafter / TopKTreeDrafter / MultiNoiseDrafter
            wrapper); one prompt at a time, reference acceptance path.
        valid_vocab: ids >= valid_vocab are padding rows and are never emitted (default: all).
        on_tokens: called with each committed run of new tokens (a list of ints), for streaming; one prompt
            only (a batch with on_tokens is refused).
        timer: a `Timer` marking every round phase; Timer(sync=True) synchronises the device around each
            phase so that the stats' times are exact on a GPU.
        cuda_graphs: run the target as a `StaticTarget` (target/static.py): static KV buffers, rollback a
            length update, and its 1-token and (k+1)-token forwards CUDA graphs on a GPU (the same code
            eagerly elsewhere); each round's bookkeeping (rollback, the drafter's memory, the next anchor)
            on the device, one graph per k, before the round's one host read (round_commit.py). Kept on a
            `Target` for later calls; chain rounds of one prompt only.
    Warns:
        UserWarning (one line) when the drafter's weights and the target differ in dtype; it runs as is.
    Returns:
        GenerateOutput(tokens, stats), or a list of them for B prompts. At T = 0 the tokens equal plain
        greedy decoding of the target; at T > 0 their distribution equals the target's, whatever the drafter.
    Raises (one line naming the argument, and in a list of prompts the prompt's row, before any model work
    except the NaN/+inf check):
        TypeError: a `target` that is neither a Target nor an HF causal LM, a `drafter` that is neither
            None nor a block drafter (e.g. a checkpoint path or 'random': the CLI's names, not drafters),
            `input_ids` that are text or not integers, non-integer `max_new_tokens`, `seed`, `top_k`, `valid_vocab`,
            `stop_token_ids`, an `on_tokens` that is not callable, a `timer` that is not a Timer.
        ValueError: an empty prompt or an empty list of prompts, an [B, S] tensor with B > 1 (pass a list,
            or the tokenizer's output), ids outside the vocabulary, a prompt longer than the target's context (`input_ids`) or
            prompt + max_new_tokens longer (`max_new_tokens`), a sampling parameter out of its range,
            stop ids outside the vocabulary, a per-prompt list of the wrong length, NaN/+inf target
            logits, a tree without a tree drafter (or with several prompts), or `cuda_graphs` with a tree
            or several prompts; TargetMismatch (a ValueError naming `drafter`): a drafter built for another
            target (vocabulary, hidden size or tap layers), as `from_pretrained` refuses it.
    """
    target = as_target(target)
    check_drafter(drafter, tree)
    check_drafter_target(target, drafter)
    check_hooks(on_tokens, timer)
    warn_dtype_mismatch(target, drafter)
    if not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs: expected True or False, got {cuda_graphs!r}")
    input_ids, batched = as_prompts(input_ids)
    if cuda_graphs and (tree is not None or batched):
        raise ValueError(f"cuda_graphs: {CUDA_GRAPHS_SHAPES}")
    if batched:
        return _generate_batch(target, drafter, input_ids, max_new_tokens, temperature, top_k, top_p, seed,
                               stop_token_ids, tree, valid_vocab, on_tokens, timer)
    check_one_row("seed", seed)
    check_one_row("max_new_tokens", max_new_tokens)
    prompt = check_prompt(target, input_ids, max_new_tokens)
    if cuda_graphs:
        target = _static(target, drafter, prompt.shape[1] + max_new_tokens)
    req = Request(temperature, top_k, top_p, seed, valid_vocab, max_new_tokens,
                  _stop_set(stop_token_ids, target.vocab_size), on_tokens, target.device)
    _check_valid_vocab(req.valid_vocab, target.vocab_size)
    round_fn = static_round if cuda_graphs else _round_function(drafter, tree)
    timer = timer or Timer()
    stats = GenerateStats(prompt_tokens=prompt.shape[1])
    if max_new_tokens == 0:
        return GenerateOutput([], stats)
    start = timer.now(target.device)
    with torch.inference_mode():
        state = prefill(target, drafter, prompt, req, stats, timer)
        if cuda_graphs:
            entries = prompt.shape[1] + max_new_tokens + _block_size(drafter)  # the most a call's memory holds
            state.commit = RoundCommit(target, drafter, state.memory, entries)
        state.emit(state.anchor.tolist(), req)
        while not state.stopped:
            round_fn(target, drafter, state, req, stats, timer)
    stats.new_tokens = len(state.tokens)
    stats.total_time_s = timer.now(target.device) - start
    return GenerateOutput(state.tokens, stats)


def _static(target: Target, drafter, capacity: int) -> StaticTarget:
    """The StaticTarget for a call needing `capacity` KV slots (a round's forward never writes past the
    prompt + max_new_tokens: its drafts are capped by the remaining budget), graphing T = 1 and k + 1."""
    return static_target_for(target, capacity, sorted({1, _block_size(drafter)}))


def _block_size(drafter) -> int:
    """k + 1: the verify block of a full round (1 for the AR baseline)."""
    return 1 + (0 if drafter is None else int(drafter.num_draft_tokens))


def as_target(target) -> Target:
    """`target` as a Target (an HF causal LM is wrapped); TypeError naming `target` for anything else."""
    if isinstance(target, Target):
        return target
    if not isinstance(target, torch.nn.Module) or not hasattr(target, "get_input_embeddings"):
        hint = " (a model name or path: load it with fm.load_target(name))" if isinstance(target, str) else ""
        raise TypeError(f"target: expected a Target or a Hugging Face causal LM, got {_describe(target)}{hint}")
    return Target(target)


#: what the loop calls on a drafter (the BlockDrafter protocol, drafters/common/base.py); chain rounds also
#: call `draft` and read `num_draft_tokens`, tree rounds call `draft_tree` (checked by _round_function)
DRAFTER_API = ("target_layer_ids", "new_memory", "extend_memory")
CHAIN_API = ("num_draft_tokens", "draft")


def check_drafter(drafter, tree: Optional[TreeSpec] = None) -> None:
    """TypeError naming `drafter` unless it is None (the AR baseline) or has the BlockDrafter API (for
    chain rounds, `tree` None, also `draft` and `num_draft_tokens`)."""
    needed = DRAFTER_API + (CHAIN_API if tree is None else ())
    missing = [] if drafter is None else [name for name in needed if not hasattr(drafter, name)]
    if missing:
        hint = (" (a checkpoint path or 'random' names a drafter on the CLI; in Python load one with "
                "fm.FlashMapDrafter.from_pretrained(path, target), DFlashDrafter or Eagle3Drafter)"
                if isinstance(drafter, str) else f" (it lacks {', '.join(missing)})")
        raise TypeError(f"drafter: expected None (plain decoding) or a block drafter (FlashMapDrafter, "
                        f"DFlashDrafter, Eagle3Drafter or any object with {', '.join(needed)}), "
                        f"got {_describe(drafter)}{hint}")


def check_hooks(on_tokens, timer) -> None:
    """TypeError naming `on_tokens` unless None or callable, `timer` unless None or Timer-like (mark, now)."""
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens: expected None or a callable taking a list of new token ids, "
                        f"got {_describe(on_tokens)}")
    if timer is not None and not all(callable(getattr(timer, name, None)) for name in ("mark", "now")):
        raise TypeError(f"timer: expected None or a Timer (fm.Timer(), Timer(sync=True)), got {_describe(timer)}")


def inner_drafter(drafter) -> Optional[torch.nn.Module]:
    """The drafter module inside wrappers (their `inner`), or None when there is none (a lookup drafter)."""
    for _ in range(8):  # wrappers nest a few deep at most (AutoDrafter(StepsDrafter(FlashMapDrafter)))
        if drafter is None or isinstance(drafter, torch.nn.Module):
            break
        drafter = getattr(drafter, "inner", None)
    return drafter if isinstance(drafter, torch.nn.Module) else None


def drafter_dtype(drafter) -> Optional[torch.dtype]:
    """The floating dtype of a drafter's weights (through wrappers' `inner`); None without weights."""
    drafter = inner_drafter(drafter)
    if drafter is None:
        return None
    return next((p.dtype for p in drafter.parameters() if p.is_floating_point()), None)


def check_drafter_target(target: Target, drafter) -> None:
    """TargetMismatch (a ValueError, one line naming `drafter`) when the drafter (through wrappers) was built
    for another target's shapes: the check `from_pretrained` runs (`ReadsTarget.check_target`)."""
    module = inner_drafter(drafter)
    if module is None or not hasattr(module, "check_target"):
        return
    try:
        module.check_target(target)
    except TargetMismatch as err:
        raise TargetMismatch(f"drafter: {err}") from None


def warn_dtype_mismatch(target: Target, drafter) -> None:
    """One-line UserWarning when the drafter's weights and the target differ in dtype. The loop runs them as
    they are (the drafter casts the target's taps to its own dtype; the output stays lossless, the target
    verifies every token), but a bf16 drafter on a CPU without bf16 hardware drafts several times slower,
    and `from_pretrained` keeps a checkpoint's stored dtype unless given one (load_drafter casts to the
    target's)."""
    dtype = drafter_dtype(drafter)
    if dtype is not None and dtype != target.dtype:
        mine, theirs = (str(d).removeprefix("torch.") for d in (dtype, target.dtype))
        warnings.warn(f"generate: the drafter's weights are {mine}, the target's {theirs}: the taps are cast to "
                      f"{mine} for drafting (lossless all the same); to match, load it with "
                      f"from_pretrained(..., dtype=target.dtype) or call drafter.to(torch.{theirs})",
                      UserWarning, stacklevel=3)


def _describe(value) -> str:
    """'None', "str 'random'" or the type's name, for argument errors."""
    if value is None or isinstance(value, (str, int, float)):
        return f"{type(value).__name__} {value!r}" if value is not None else "None"
    return type(value).__name__


def per_prompt(value, batch: int, name: str) -> list:
    """An int for every prompt, or a list/tuple of `batch` of them; ValueError naming `name` otherwise."""
    if isinstance(value, (list, tuple)):
        if len(value) != batch:
            raise ValueError(f"{name}: expected one value per prompt ({batch}), got {len(value)}")
        return list(value)
    return [value] * batch


def check_one_row(name: str, value) -> None:
    """ValueError naming `name` for a list of values (seeds, budgets) with one prompt: each is a row's, one
    prompt each."""
    if isinstance(value, (list, tuple)):
        raise ValueError(f"{name}: a list needs one prompt per value (one row each): got {len(value)} values "
                         f"for 1 prompt; pass {len(value)} prompts, or one int {name}")


def _generate_batch(target, drafter, prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                    tree, valid_vocab, on_tokens, timer) -> list:
    """`generate` over a list of prompts: one GenerateOutput per prompt (batched.py)."""
    if tree is not None:
        raise ValueError("tree: tree drafting runs one prompt at a time; pass a single prompt")
    if on_tokens is not None:
        raise ValueError("on_tokens: streaming runs one prompt at a time; pass a single prompt")
    budgets, seeds = per_prompt(max_new_tokens, len(prompts), "max_new_tokens"), per_prompt(seed, len(prompts), "seed")
    checked = check_prompts(target, prompts, budgets)
    stop = _stop_set(stop_token_ids, target.vocab_size)
    requests = [Request(temperature, top_k, top_p, s, valid_vocab, m, stop, None, target.device)
                for s, m in zip(seeds, budgets)]
    _check_valid_vocab(requests[0].valid_vocab, target.vocab_size)
    return generate_rows(target, drafter, checked, requests, timer or Timer())


def check_prompts(target: Target, prompts: list, budgets: list[int]) -> list[torch.Tensor]:
    """`check_prompt` of each prompt with its budget; its error ends naming the prompt's row (its index in the
    list of prompts)."""
    checked = []
    for row, (prompt, budget) in enumerate(zip(prompts, budgets)):
        try:
            checked.append(check_prompt(target, prompt, budget))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{err}, in prompt row {row} of {len(prompts)}") from None
    return checked


def prefill(target: Target, drafter, prompt: torch.Tensor, req: Request, stats: GenerateStats,
            timer: Timer) -> State:
    """Runs the prompt through the target, samples the first token, fills the drafter's memory."""
    t0 = timer.now(target.device)
    cache = target.new_cache()
    tap_ids = () if drafter is None else tuple(drafter.target_layer_ids)
    out = target.forward(prompt, cache, num_logits=1, tap_layer_ids=tap_ids)
    position = prompt.shape[1] - 1
    first = ops.sample(out.logits[:, -1], **req.sampling(position))
    memory = None
    if drafter is not None:
        memory = drafter.new_memory(1, target.device)
        drafter.extend_memory(memory, prompt, out.taps)
    stats.prefill_time_s += timer.now(target.device) - t0
    return State(cache, memory, first, position + 1, [], tap_ids)


def _draft_verify(target, drafter, state: State, req: Request, timer: Timer):
    """The round's common front: draft k tokens, the target's forward on [anchor, drafts], `verify`.
    Returns (draft seconds, t1, k, block, forward output, verify result)."""
    dev = target.device
    t0 = timer.mark("round", dev)
    drafts = _draft(drafter, state, req)
    t1 = timer.mark("draft", dev)
    k = drafts.shape[1]
    block = torch.cat([state.anchor[:, None], embeddable(drafts, target.vocab_size)], dim=1)
    out = target.forward(block, state.cache, num_logits=k + 1, tap_layer_ids=state.tap_ids)
    timer.mark("forward", dev)
    res = ops.verify(out.logits, drafts, **req.sampling(state.position), check=False)
    return t1 - t0, t1, k, block, out, res


def _finish_round(target, state: State, req: Request, stats: GenerateStats, timer: Timer, draft_s: float,
                  t1: float, k: int, n_acc: int, status: int, tokens: list[int]) -> None:
    """The round's common end on the host: a verify error raised, the stats, the emitted tokens."""
    if status & ops.STATUS_ERRORS:
        raise ValueError(f"target logits hold NaN/+inf or no finite value at positions "
                         f"{state.position}..{state.position + k} (verify status {status})")
    stats.add_round(k, n_acc)
    stats.draft_time_s += draft_s
    stats.verify_time_s += timer.now(target.device) - t1
    returned = state.emit(tokens[:n_acc + 1], req)
    if returned < n_acc + 1:  # a stop token: the stats describe exactly the returned tokens
        stats.cut_last_round(returned)
    timer.mark("commit", target.device)


def chain_round(target: Target, drafter, state: State, req: Request, stats: GenerateStats, timer: Timer) -> None:
    """One round: draft k tokens → target forward on [anchor, drafts] → `verify` → keep anchor + accepted
    (roll back the rest) → the bonus is the next anchor → emit accepted + bonus."""
    draft_s, t1, k, block, out, res = _draft_verify(target, drafter, state, req, timer)
    n_acc, status, *tokens = torch.cat([res.num_accepted.long(), res.status.long(), res.tokens[0]]).tolist()
    timer.mark("verify", target.device)  # the line above is the one host sync of the round
    if not status & ops.STATUS_ERRORS:
        target.rollback(state.cache, k - n_acc)
        kept_taps = None if out.taps is None else out.taps[:, :n_acc + 1]
        state.advance(drafter, block[:, :n_acc + 1], kept_taps, res.tokens[:, n_acc])
    _finish_round(target, state, req, stats, timer, draft_s, t1, k, n_acc, status, tokens)


def static_round(target: StaticTarget, drafter, state: State, req: Request, stats: GenerateStats,
                 timer: Timer) -> None:
    """`chain_round` with cuda_graphs: the bookkeeping on the device (round_commit.py: KV rollback, the
    memory's counted write, next anchor, readback; one CUDA graph per k), then the round's one host read
    (the readback) and the host's share: lengths, stats, emit."""
    draft_s, t1, k, block, out, res = _draft_verify(target, drafter, state, req, timer)
    timer.mark("verify", target.device)
    readback = state.commit(state.cache, block, out.taps, res)
    n_acc, status, *tokens = readback.tolist()  # the one host read of the round
    if not status & ops.STATUS_ERRORS:
        state.commit.settle(k, n_acc)
        state.anchor, state.position = state.commit.anchor, state.position + n_acc + 1
    _finish_round(target, state, req, stats, timer, draft_s, t1, k, n_acc, status, tokens)


def _draft(drafter, state: State, req: Request) -> torch.Tensor:
    """[1, k] int64 draft tokens (-1 = no proposal); empty for the AR baseline or a zero budget."""
    k = 0 if drafter is None else min(drafter.num_draft_tokens, state.draft_budget(req))
    if k == 0:
        return state.anchor.new_empty((1, 0))
    position = torch.full_like(req.seed_tensor, state.position)
    drafts = drafter.draft(state.memory, state.anchor, num_tokens=k, seed=req.seed_tensor, position=position)
    if drafts.dim() != 2 or drafts.shape[0] != 1 or drafts.shape[1] > k:  # fewer: e.g. a short n-gram match
        raise ValueError(f"drafter returned draft_tokens of shape {tuple(drafts.shape)}, expected (1, n <= {k})")
    return drafts.to(torch.int64)


def _round_function(drafter, tree: Optional[TreeSpec]) -> Callable:
    """The chain round, or the tree round for `tree`."""
    if tree is None:
        return chain_round
    if not isinstance(tree, TreeSpec):
        raise ValueError(f"tree must be a TreeSpec(depth, topk, num_nodes), got {tree!r}")
    if not hasattr(drafter, "draft_tree"):
        raise ValueError(f"tree: tree decoding needs a drafter with draft_tree (Eagle3Drafter; a block drafter "
                         f"wrapped in LookupDrafter, MultiNoiseDrafter or TopKTreeDrafter from "
                         f"flashmap_ext.draft_shapes), got {type(drafter).__name__}")
    return functools.partial(tree_round, spec=tree)


def _check_valid_vocab(valid_vocab: Optional[int], vocab_size: int) -> None:
    """ValueError naming valid_vocab when it exceeds the target's logit width (checked before any model work)."""
    if valid_vocab is not None and valid_vocab > vocab_size:
        raise ValueError(f"valid_vocab must be in [1, {vocab_size}] (the target's logit width), got {valid_vocab}")


def _stop_set(stop_token_ids, vocab_size: int) -> frozenset:
    """stop_token_ids as a frozenset of ints: None = none, a single id (int or 0-d tensor) = that one.
    TypeError for non-integer ids, ValueError for ids outside the target's vocabulary [0, vocab_size)."""
    if stop_token_ids is None:
        return frozenset()
    if isinstance(stop_token_ids, torch.Tensor):
        if stop_token_ids.is_floating_point() or stop_token_ids.is_complex() or stop_token_ids.dtype == torch.bool:
            raise TypeError(f"stop_token_ids must be integer token ids, got a {stop_token_ids.dtype} tensor")
        stop_token_ids = stop_token_ids.tolist()
    ids = [stop_token_ids] if isinstance(stop_token_ids, numbers.Integral) else stop_token_ids
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"stop_token_ids must be a token id or a sequence of them, got {stop_token_ids!r}")
    ids = list(ids)
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if bad:
        raise TypeError(f"stop_token_ids must be integer token ids, got {bad[:4]!r}")
    outside = [t for t in ids if not 0 <= t < vocab_size]  # such an id could never be emitted: a wrong id
    if outside:
        raise ValueError(f"stop_token_ids must be token ids in [0, {vocab_size}) (the target's vocabulary), "
                         f"got {outside[:4]}")
    return frozenset(int(t) for t in ids)


def check_prompt(target: Target, input_ids, max_new_tokens: int) -> torch.Tensor:
    """The prompt as a [1, S] int64 tensor on the target's device, or a ValueError saying why not."""
    ids = as_ids(input_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    ids = ids.to(device=target.device, dtype=torch.int64)
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [S] or [1, S] (batch size 1), got shape {tuple(ids.shape)}")
    S = ids.shape[1]
    if S == 0:
        raise ValueError("input_ids: an empty prompt: generate needs at least one prompt token (e.g. BOS)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    if S > target.max_positions:
        raise ValueError(f"input_ids: prompt too long: {S} tokens exceed the target's context of "
                         f"{target.max_positions} positions")
    if S + max_new_tokens > target.max_positions:
        raise ValueError(f"max_new_tokens: {max_new_tokens} new tokens after a {S}-token prompt exceed the target's "
                         f"context of {target.max_positions} positions (at most {target.max_positions - S} here)")
    if int(ids.min()) < 0 or int(ids.max()) >= target.embed_tokens.num_embeddings:
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"input_ids must lie in [0, {target.embed_tokens.num_embeddings}), got {bad}")
    return ids

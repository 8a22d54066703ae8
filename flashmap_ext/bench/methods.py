"""The decoding methods a benchmark compares, each a `generate` drafter or a Hugging Face peer.

- AR: `speculate.generate` with no drafter (the baseline every speedup divides by).
- FlashMap-1 / FlashMap-2: one FlashMap checkpoint drafted with 1 or 2 flow-map steps (`StepsDrafter`).
- DFlash, EAGLE-3: their checkpoints, through the same loop.
- EAGLE-3 tree: the same EAGLE-3 drafter drafting token trees (`generate(..., tree=TreeSpec)`; the DFlash
  paper's comparison uses depth 7, top-k 10, 16 nodes).
- HF greedy / prompt lookup: `model.generate` (do_sample=False, and prompt_lookup_num_tokens=10), what a
  user would pick instead of this library.
The shuffle test wraps a FlashMap drafter in `PerSlotNoiseDrafter` (each slot from its own noise block).
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from flashmap_ext.bench.metrics import Method
from flashmap_ext.bench.shapes import auto_methods, shape_methods
from flashmap_ext.drafters.drafting import draft_block
from flashmap_ext.drafters.flashmap.mode import draft_best_of, draw_seed
from flashmap_ext.drafters.load import checkpoint_type, load_drafter
from flashmap_ext.tree import TreeSpec

#: seed offset between the per-slot noise streams of the shuffle test (a prime, far from request seeds)
SLOT_SEED_STRIDE = 1_000_003


class StepsDrafter:
    """A FlashMap drafter that drafts with a fixed number of flow-map steps (1 or 2)."""

    def __init__(self, drafter, steps: int):
        self.inner, self.steps = drafter, steps
        self.num_draft_tokens = drafter.num_draft_tokens
        self.target_layer_ids = drafter.target_layer_ids

    def new_memory(self, batch_size, device):
        return self.inner.new_memory(batch_size, device)

    def extend_memory(self, memory, token_ids, taps):
        self.inner.extend_memory(memory, token_ids, taps)

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        block = draft_block(self.inner, memory, anchor_tokens, steps=self.steps, seed=seed, position=position)
        return block.tokens[:, :num_tokens]


class NoiseMeanDrafter(StepsDrafter):
    """A FlashMap drafter that drafts from the noise's mean z = 0 instead of a draw (a probe: one
    deterministic block, as an argmax of the per-slot marginals is; z = 0 itself is never a training state)."""

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        c = self.inner.config
        z = torch.zeros(anchor_tokens.shape[0], c.block_size, c.d_target, device=anchor_tokens.device)
        return draft_block(self.inner, memory, anchor_tokens, steps=self.steps, noise=z).tokens[:, :num_tokens]


class BestOfDrafter(StepsDrafter):
    """Mode-seeking probe: `draws` noise draws per block, the one the drafter rates best (drafters/flashmap/mode.py)."""

    def __init__(self, drafter, steps: int, draws: int):
        super().__init__(drafter, steps)
        self.draws = draws

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        return draft_best_of(self.inner, memory, anchor_tokens, draws=self.draws, steps=self.steps, seed=seed,
                             position=position)[:, :num_tokens]


class MarginalArgmaxDrafter(BestOfDrafter):
    """Mode-seeking probe: per slot, the argmax of the drafter's softmax averaged over `draws` noise draws (a
    Monte-Carlo estimate of its per-slot marginals; no joint structure kept)."""

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        mean = 0.0
        for i in range(self.draws):
            block = draft_block(self.inner, memory, anchor_tokens, steps=self.steps, seed=draw_seed(seed, i),
                                position=position, return_logits=True)
            mean = mean + torch.softmax(block.logits.float(), dim=-1) / self.draws
        return self.inner.to_target_ids(mean.argmax(dim=-1))[:, :num_tokens]


class PerSlotNoiseDrafter(StepsDrafter):
    """Shuffle-test probe: slot j is taken from a block drafted with its own independent noise draw, so
    slots stop sharing one noise sample. Same per-slot marginals, no joint structure; Δγ = γ(shared) −
    γ(per-slot) measures how much the drafter's block is jointly coherent. K drafter calls per round."""

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        out = []
        for j in range(num_tokens):
            slot_seed = seed + (j + 1) * SLOT_SEED_STRIDE
            block = draft_block(self.inner, memory, anchor_tokens, steps=self.steps, seed=slot_seed,
                                position=position)
            out.append(block.tokens[:, j])
        return torch.stack(out, dim=1) if out else anchor_tokens.new_empty((anchor_tokens.shape[0], 0))


def dflash_name(drafter) -> str:
    """The row name of a --dflash drafter: DFlash2 when it has a candidate selector."""
    return "DFlash2" if hasattr(drafter, "candidate_selector") else "DFlash"


def build_methods(target, dtype: torch.dtype, flashmap: str | None, dflash: str | None, eagle3: str | None,
                  peers: bool = True, eagle3_tree: TreeSpec | None = None, shapes: bool = False,
                  auto: bool = False, recalibrate: bool = False) -> list[Method]:
    """AR first (speedups divide by it), then the drafters given (EAGLE-3 as a chain and, with
    `eagle3_tree`, as a tree), with `shapes` the draft-shape rows (bench/shapes.py), with `auto` the
    cost-model pick (`recalibrate`: its cost table measured again), then the HF peers."""
    methods = [Method("AR", None)]
    fm = dfl = None
    if flashmap:
        fm = load_drafter(flashmap, target, "flashmap", dtype=dtype)
        methods += [Method("FlashMap-1", StepsDrafter(fm, 1)), Method("FlashMap-2", StepsDrafter(fm, 2))]
    if dflash:
        kind = checkpoint_type(dflash, "--dflash")  # a DFlash or DFlash2 checkpoint
        dfl = load_drafter(dflash, target, kind, dtype=dtype, flag="--dflash")
        methods.append(Method(dflash_name(dfl), dfl))
        if kind == "dflash2":  # the selector's exact best path through the block's top-k lattice
            best = load_drafter(dflash, target, kind, dtype=dtype, flag="--dflash")
            best.path = "best"
            methods.append(Method("DFlash2 best path", best))
    if shapes:
        methods += shape_methods(fm and StepsDrafter(fm, 1), dfl)
    if auto:
        methods += auto_methods(target, fm and StepsDrafter(fm, 1), refresh=recalibrate)
    if eagle3:
        eagle = load_drafter(eagle3, target, "eagle3", dtype=dtype, flag="--eagle3")
        methods.append(Method("EAGLE-3", eagle))
        if eagle3_tree is not None:
            methods.append(Method("EAGLE-3 tree", eagle, eagle3_tree))
    if peers:
        methods += [Method("HF greedy", "hf"), Method("prompt lookup", "pld")]
    return methods


class PeerOutput(NamedTuple):
    tokens: list
    time_s: float


@torch.inference_mode()
def run_peer(model, kind: str, input_ids: list[int], max_new_tokens: int, temperature: float,
             stop_token_ids, seed: int) -> PeerOutput:
    """One HF `generate` call: kind "hf" (plain) or "pld" (prompt lookup, 10 tokens)."""
    ids = torch.tensor([input_ids], device=model.device)
    kwargs: dict = dict(max_new_tokens=max_new_tokens, eos_token_id=sorted(stop_token_ids),
                        pad_token_id=sorted(stop_token_ids)[0], attention_mask=torch.ones_like(ids))
    if temperature > 0:
        torch.manual_seed(seed)
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    if kind == "pld":
        kwargs["prompt_lookup_num_tokens"] = 10
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    return PeerOutput(out[0, ids.shape[1]:].tolist(), time.perf_counter() - start)

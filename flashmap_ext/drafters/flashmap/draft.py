"""`draft_flashmap`: the FlashMap path of `flashmap_ext.draft_block` (DESIGN.md §3.2, §4): the flow-map
step(s) from shared noise.

The reference (PyTorch) path is here; the fused path (fused.py) computes the same with the ops.dit kernels.
Users call `flashmap_ext.draft_block`, the one drafting call for every drafter (drafters/drafting.py).
"""
from __future__ import annotations

import torch
from torch import nn

from flashmap_ext.drafters.flashmap.draft_args import check_draft_args
from flashmap_ext.drafters.flashmap.flow import flow_map_jump
from flashmap_ext.drafters.flashmap.fused import fused_draft_block, fused_reads, graphs_enabled
from flashmap_ext.drafters.flashmap.memory import DraftBlock, FlashMapMemory, per_row


@torch.no_grad()
def draft_flashmap(drafter: nn.Module, memory: FlashMapMemory, anchor_tokens: torch.Tensor, *,
                   steps: int | None = None, noise: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                   position: torch.Tensor | None = None, return_logits: bool = False) -> DraftBlock:
    """One FlashMap drafting call (DESIGN.md §3.2, §4); `flashmap_ext.draft_block` adds the checks every
    drafter shares (batch, position against the memory, num_tokens) and is the one to call.

    anchor_tokens: [B] int64 in [0, vocab_size), the last committed token of each row (not in `memory`).
    steps: 1 (`net(z, 0, 1)`) or 2 (`A = softmax(net(z, 0, ½))`, jump to t(½), `net(x_m, ½, 1)`);
        default `config.draft_steps`. The block's noise z is shared by both steps (no fresh noise).
    noise: [B, K, d_target] d-space noise z ~ N(0, EᵀE); else drawn from the drafter's own stream keyed
        by seed, position ([B] int64 or ints; `position` = absolute position of the anchor).
    Returns DraftBlock(tokens = per-slot argmax as target ids, logits if return_logits).
    Raises ValueError / TypeError naming the offending argument (draft_args.py): steps not 1 or 2, an
    empty or foreign memory, anchor ids outside the vocabulary, a seed or position outside [0, 2**63),
    non-float, misshapen or non-finite noise, meta tensors.

    Paths: on CUDA with bf16 weights and kernel-friendly shapes (`fused_supported`) the fused kernels run
    (`drafter.allow_fused = False` forces the reference path); without return_logits that step, noise
    included, is captured once in a CUDA graph per (memory buffers, batch size, steps, seeded or given
    noise) and replayed on later calls (`drafter.allow_graphs = False` or FLASHMAP_CUDA_GRAPHS=0 runs it
    eagerly; never while torch.compile traces). CPU: the reference path.
    """
    c = drafter.config
    steps = check_draft_args(drafter, memory, anchor_tokens, steps, noise, seed, position)
    packed = drafter.fused_weights() if anchor_tokens.is_cuda and fused_reads(memory, c.context_window) else None
    if packed is not None:  # fused CUDA kernels: same result up to fp rounding (python_tests/drafters/test_dit_fused.py)
        return fused_draft_block(packed, memory, anchor_tokens, steps=steps, noise=noise, seed=seed,
                                 position=position, return_logits=return_logits, graph=graphs_enabled(drafter))
    B = anchor_tokens.shape[0]
    if noise is None:
        if seed is None or position is None:
            missing = ", ".join(n for n, v in (("seed", seed), ("position", position)) if v is None)
            raise ValueError(f"{missing}: required when noise is None (the noise is drawn from seed and position)")
        noise = drafter.sample_noise(*(per_row(x, B, anchor_tokens.device, n) for x, n in ((seed, "seed"),
                                                                                          (position, "position"))))
    z = noise.float()
    if steps == 1:
        logits = drafter.denoise(memory, anchor_tokens, z, 0.0, 1.0)
    else:
        a = torch.softmax(drafter.denoise(memory, anchor_tokens, z, 0.0, 0.5), dim=-1)
        s, t = z.new_zeros(B, c.block_size), z.new_full((B, c.block_size), drafter.t_mid)
        x_mid = flow_map_jump(z, drafter.probs_to_state(a), s, t)
        logits = drafter.denoise(memory, anchor_tokens, x_mid, 0.5, 1.0)
    tokens = drafter.to_target_ids(logits.argmax(dim=-1))
    return DraftBlock(tokens, logits if return_logits else None)

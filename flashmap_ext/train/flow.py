"""`train flow`: τ-uniform cross-entropy training of the FlashMap flow model (DESIGN.md §4, §8).

Per block (anchor) of the batch: τ ~ U[0, 1] stratified over the blocks, t = t(τ), one d-space noise
z ~ N(0, EᵀE) per slot, x_t = (1−t)·z + t·E[y] (Eᵀ of the V-space interpolant, FLM §3.1), logits =
net(x_t, τ, τ), per-slot CE against y weighted by w_k = exp(−(k−1)/7) (DFlash/FlashMap slot weights).
The FLM objective is CE over τ-reparameterised time (Lee et al. 2026, arXiv:2602.16813; `FLM.loss`).
With `loss="kl"`, blocks at τ = 0 (`tau0_frac` of them) are trained on the target's stored distribution
instead (forward KL + ce_weight·CE on its argmax, train/soft_labels.py): there x_t is pure noise, independent
of the label, so the optimal denoiser is exactly that distribution. Blocks at τ > 0 keep the CE of the data
token, which their noisy state was made from (its posterior given x_t is not the target's distribution).
With `rollout_weight` w > 0, blocks at τ = 0 also train the second evaluation of the 2-step draft on the state
that draft builds (`second_step_loss`); the loss is (1 − w)·(the above) + w·(that CE).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap.flow import flow_map_jump, interpolant
from flashmap_ext.train.dflash import reachable_slots
from flashmap_ext.train.soft_labels import SOFT_KEYS, require_soft_labels, soft_slot_loss

IGNORE = -100
SLOT_DECAY = 7.0
BATCH_KEYS = ("input_ids", "taps", "anchor_pos", "labels")


def slot_weights(num_slots: int, decay: float | None = SLOT_DECAY, device=None) -> torch.Tensor:
    """[num_slots] fp32: w_k = exp(−(k−1)/decay), k = 1 … num_slots. decay None: tied to K as DFlash ties
    it to its block (`train.dflash.default_gamma(K + 1)`: 7 at K = 15, 7·K/15 otherwise; 3.73 at K = 8)."""
    if decay is None:
        from flashmap_ext.train.dflash import default_gamma
        decay = default_gamma(num_slots + 1)
    if decay <= 0:
        raise ValueError(f"slot decay must be > 0 (or None: tied to K), got {decay}")
    return torch.exp(-torch.arange(num_slots, dtype=torch.float32, device=device) / decay)


def stratified_uniform(n: int, generator: torch.Generator) -> torch.Tensor:
    """[n] fp64 on the generator's device: one draw in each stratum [i/n, (i+1)/n), in random order."""
    dev = generator.device
    strata = torch.randperm(n, generator=generator, device=dev).double()
    return (strata + torch.rand(n, generator=generator, device=dev, dtype=torch.float64)) / n


def device_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """`generator` itself on its own device; otherwise a generator on `device` seeded from it, so noise is
    drawn where it is used (a CPU-drawn [B, A, K, d] noise tensor would cost a host copy per step)."""
    if torch.device(device).type == generator.device.type:
        return generator
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def unwrap(model: torch.nn.Module) -> FlashMapDrafter:
    """The FlashMapDrafter inside a DDP wrapper (FSDP2 modules are the drafter itself)."""
    drafter = getattr(model, "module", model)
    if not isinstance(drafter, FlashMapDrafter):
        raise TypeError(f"model: expected a FlashMapDrafter (optionally DDP-wrapped), got {type(drafter).__name__}")
    return drafter


def prepare_batch(drafter: FlashMapDrafter, batch: dict) -> dict:
    """Checks the batch format (train/anchors.py), moves it to the drafter's device and maps labels to
    the flow's vocabulary (draft-vocab rows; ids outside it become −100). Raises KeyError/ValueError."""
    for key in BATCH_KEYS:
        if key not in batch:
            raise KeyError(f"batch has no {key!r} (expected {', '.join(BATCH_KEYS)})")
    device = drafter.slot_pos.device
    b = {key: batch[key].to(device) for key in BATCH_KEYS + tuple(k for k in SOFT_KEYS if k in batch)}
    labels, anchors, k = b["labels"], b["anchor_pos"], drafter.num_draft_tokens
    if labels.dim() != 3 or labels.shape[:2] != anchors.shape or labels.dtype != torch.int64 or labels.shape[2] < k:
        raise ValueError(f"labels: expected [B, A, K>={k}] int64 matching anchor_pos {tuple(anchors.shape)}, "
                         f"got {tuple(labels.shape)} {labels.dtype}")
    b["labels"] = labels[:, :, :k]
    b["state_labels"] = drafter.to_state_ids(b["labels"])
    for key in SOFT_KEYS:
        if key in b:
            b[key] = b[key][:, :, :k]
    return b


def chunked(fn: Callable, *tensors: torch.Tensor, chunk: int, recompute: bool = True) -> list[torch.Tensor]:
    """Applies fn to slices [:, i:i+chunk] of every tensor (dim 1 = anchors) under activation
    checkpointing (when grad is on and `recompute`) and concatenates each output along dim 1. Keeps
    [B, A, K, V] logits from existing at once (DFlash trainer does the same); `recompute=False` keeps them
    instead of recomputing the head in backward (cheaper where the draft-vocab logits are small, e.g. CPU)."""
    outs = []
    for s in range(0, tensors[0].shape[1], chunk):
        args = [t[:, s:s + chunk] for t in tensors]
        use = recompute and torch.is_grad_enabled()
        outs.append(checkpoint(fn, *args, use_reentrant=False) if use else fn(*args))
    return [torch.cat(parts, 1) for parts in zip(*outs)]


def weighted_mean(per_slot: torch.Tensor, valid: torch.Tensor, decay: float | None = SLOT_DECAY) -> torch.Tensor:
    """Σ w_k·x / Σ w_k over valid slots (w from `slot_weights(K, decay)`); per_slot, valid [B, A, K]."""
    w = slot_weights(per_slot.shape[-1], decay, device=per_slot.device) * valid
    return (per_slot * w).sum() / w.sum().clamp_min(1e-6)


@torch.no_grad()
def block_metrics(loss: torch.Tensor, correct: torch.Tensor, valid: torch.Tensor) -> dict:
    """{loss, acc (top-1 over valid slots), accept_len (1 + mean leading correct run), tokens}."""
    n = int(valid.sum())
    run = (correct & valid).long().cumprod(-1).sum(-1).float()
    scored = valid[..., 0]
    return {"loss": float(loss), "acc": float((correct & valid).sum()) / n if n else math.nan,
            "accept_len": 1.0 + float(run[scored].mean()) if bool(scored.any()) else math.nan, "tokens": n}


def noisy_states(drafter: FlashMapDrafter, labels: torch.Tensor, t: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
    """x_t = (1−t)·z + t·E[y] in d-space: labels [B, A, K] target ids (−100 ok), t [B, A] -> [B, A, K, d] fp32."""
    d = drafter.config.d_target
    g = device_generator(generator, labels.device)
    xi = torch.randn(*labels.shape, d, generator=g, device=labels.device)
    data = drafter.embed_tokens(labels.clamp_min(0))
    return interpolant(drafter.noise_from_xi(xi), data, t[..., None].expand(labels.shape))


def block_taus(batch_size: int, num_anchors: int, generator: torch.Generator, tau0_frac: float = 0.0) -> torch.Tensor:
    """[B, A] fp64 training times: τ ~ U[0, 1] stratified over the blocks (DESIGN.md §4), then
    round(tau0_frac·B·A) blocks chosen at random set to τ = 0 exactly (pure noise: the only time 1-step
    drafting evaluates; our option, default 0 = the FLM recipe). ValueError unless 0 <= tau0_frac <= 1."""
    if not 0.0 <= tau0_frac <= 1.0:
        raise ValueError(f"tau0_frac must be in [0, 1], got {tau0_frac}")
    tau = stratified_uniform(batch_size * num_anchors, generator)
    n0 = round(tau0_frac * tau.numel())
    if n0:
        tau[torch.randperm(tau.numel(), generator=generator, device=tau.device)[:n0]] = 0.0
    return tau.view(batch_size, num_anchors)


def head_ce(drafter: FlashMapDrafter, h: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
            tau_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [..., K, V_s] fp32, per-slot CE [..., K] against y, 0 where y = −100) of hidden h [..., K, d] for
    slot states x at clocks tau_c [...]."""
    logits = drafter.logits_from_hidden(h, drafter.state_term(x, tau_c))
    ce = F.cross_entropy(logits.flatten(0, -2), y.flatten(), ignore_index=IGNORE, reduction="none").view_as(y)
    return logits, ce


def flow_loss(model: torch.nn.Module, batch: dict, generator: torch.Generator, *,
              anchor_chunk: int = 16, tau0_frac: float = 0.0, slot_decay: float | None = SLOT_DECAY,
              recompute_head: bool = True, loss: str = "ce", ce_weight: float = 0.0,
              rollout_weight: float = 0.0, rollout_reachable: bool = False,
              reachable: bool = False) -> tuple[torch.Tensor, dict]:
    """Slot-weighted CE of the flow model on one batch (DESIGN.md §4).

    model: a FlashMapDrafter (usually `two_time=False`; a flow map is trained on its diagonal τ_s = τ_t),
    or it wrapped by DDP; the forward goes through `model(...)` so wrapper hooks run.
    batch: input_ids [B, T] int64, taps [B, T, n_taps·d_target], anchor_pos [B, A] int64 (−1 padded),
    labels [B, A, K'] int64 (K' >= K; −100 masked). generator: the source of τ and noise.
    tau0_frac: fraction of blocks trained at τ = 0 (see `block_taus`). slot_decay: w_k's decay (None: tied
    to K, `slot_weights`). recompute_head: checkpoint the LM head per anchor chunk (see `chunked`).
    loss: "ce", or "kl" (τ = 0 blocks on the batch's soft labels, module docstring; ValueError without
    them or with tau0_frac = 0, where no block would use them).
    rollout_weight: in [0, 1], the share of the loss given to the 2-step draft's second evaluation at the
    τ = 0 blocks (`second_step_loss`; ValueError when no block is at τ = 0 or for a two-time model).
    rollout_reachable: that CE only at the slots verification reaches, those whose first-step draft prefix
    is right (`reachable_slots`): there slot k's target is the token after the draft's own prefix.
    reachable: the same for the τ = 0 blocks' own CE (the 1-step draft's slots verification reaches).
    Returns (scalar loss with grad, {loss, acc, accept_len, tokens, tau_mean}, + step2_loss, step2_acc,
    step2_accept_len with rollout_weight > 0).
    """
    drafter = unwrap(model)
    check_rollout(drafter, rollout_weight, tau0_frac, rollout_reachable)
    if loss == "kl":
        require_soft_labels(batch)
        if tau0_frac <= 0:
            raise ValueError("--loss kl: the flow model uses the target's distribution at τ = 0 blocks only; "
                             "set --tau0-frac > 0")
    b = prepare_batch(drafter, batch)
    B, A = b["anchor_pos"].shape
    tau = block_taus(B, A, generator, tau0_frac).to(b["labels"].device)
    t = drafter.clock.t_of_tau(tau)
    x_t = noisy_states(drafter, b["labels"], t, generator)
    tau = tau.float()
    hidden = model(b["taps"], b["input_ids"], b["anchor_pos"], x_t, tau, tau, return_hidden=True)

    def slot_ce(h: torch.Tensor, y: torch.Tensor, x: torch.Tensor, tau_c: torch.Tensor, *soft: torch.Tensor):
        logits, ce = head_ce(drafter, h, y, x, tau_c)
        if soft:
            at0 = soft[2][..., None]
            kl = soft_slot_loss(logits, soft[0], soft[1], drafter.to_state_ids, ce_weight)
            ce = torch.where(at0, kl * (soft[1][..., 0] >= 0), ce)
        out = ce, logits.argmax(-1) == y
        return out + (drafter.probs_to_state(torch.softmax(logits.detach(), -1)),) if rollout_weight else out

    soft = [b[key] for key in SOFT_KEYS] + [tau == 0] if loss == "kl" else []
    ce, correct, *mean_state = chunked(slot_ce, hidden, b["state_labels"], x_t, tau, *soft, chunk=anchor_chunk,
                                       recompute=recompute_head)
    valid = b["state_labels"] != IGNORE
    weighted = torch.where((tau == 0)[..., None], b["soft_ids"][..., 0] >= 0, valid) if soft else valid
    if reachable:
        weighted = weighted & (reachable_slots(correct) | (tau != 0)[..., None])
    total = weighted_mean(ce, weighted, slot_decay)
    metrics = {**block_metrics(total, correct, valid), "tau_mean": float(tau.mean())}
    if rollout_weight:
        reach = reachable_slots(correct) if rollout_reachable else None
        step2, m2 = second_step_loss(model, b, x_t, mean_state[0], tau == 0, reach, anchor_chunk=anchor_chunk,
                                     slot_decay=slot_decay, recompute_head=recompute_head)
        total = (1.0 - rollout_weight) * total + rollout_weight * step2
        metrics.update({f"step2_{k}": m2[k] for k in ("loss", "acc", "accept_len")}, loss=float(total.detach()))
    return total, metrics


def check_rollout(drafter: FlashMapDrafter, rollout_weight: float, tau0_frac: float, reachable: bool = False) -> None:
    """ValueError unless rollout_weight is 0 (and reachable False), or in (0, 1] with blocks at τ = 0 and a
    flow model (one time)."""
    if not 0.0 <= rollout_weight <= 1.0:
        raise ValueError(f"rollout_weight must be in [0, 1], got {rollout_weight}")
    if rollout_weight and tau0_frac <= 0:
        raise ValueError("rollout_weight: the second step is trained on the blocks at τ = 0; set tau0_frac > 0")
    if reachable and not rollout_weight:
        raise ValueError("rollout_reachable: selects the second step's slots; set rollout_weight > 0")
    if rollout_weight and drafter.config.two_time:
        raise ValueError("rollout_weight: trains a flow model's 2-step draft; this drafter is a two-time map")


def second_step_loss(model: torch.nn.Module, b: dict, z: torch.Tensor, mean_state: torch.Tensor,
                     at0: torch.Tensor, reach: torch.Tensor | None = None, *, anchor_chunk: int,
                     slot_decay: float | None, recompute_head: bool) -> tuple[torch.Tensor, dict]:
    """The second evaluation of the 2-step draft (drafters/flashmap/draft.py) at the blocks at0 [B, A]:
    x_mid = X_{0,t(½)}(z) = (1 − t(½))·z + t(½)·softmax(first evaluation)·E (mean_state [B, A, K, d], no
    gradient through it), logits = net(x_mid, ½, 1), slot-weighted CE against the labels. z [B, A, K, d]: the
    blocks' noise (x_t at τ = 0). b: `prepare_batch` output. reach [B, A, K] bool: the CE at these slots only
    (`reachable_slots`; None: all). Returns (loss, block_metrics of the at0 blocks over all their slots)."""
    drafter = unwrap(model)
    B, A = at0.shape
    x_mid = flow_map_jump(z, mean_state, z.new_zeros(B, A, 1), z.new_full((B, A, 1), drafter.t_mid))
    half, one = z.new_full((B, A), 0.5), z.new_ones(B, A)
    hidden = model(b["taps"], b["input_ids"], b["anchor_pos"], x_mid, half, one, return_hidden=True)

    def slot_ce(h: torch.Tensor, y: torch.Tensor, x: torch.Tensor, tau_c: torch.Tensor):
        logits, ce = head_ce(drafter, h, y, x, tau_c)
        return ce, logits.argmax(-1) == y

    ce, correct = chunked(slot_ce, hidden, b["state_labels"], x_mid, half, chunk=anchor_chunk, recompute=recompute_head)
    valid = (b["state_labels"] != IGNORE) & at0[..., None]
    loss = weighted_mean(ce, valid if reach is None else valid & reach, slot_decay)
    return loss, block_metrics(loss, correct, valid)

"""`distill`: semigroup flow-map distillation of a frozen flow teacher into a two-time student
(DESIGN.md §4; FMLM `FMLM.loss` PSD branch; Boffi et al. 2025, arXiv:2505.18825).

Per block (anchor), with times in τ and states/γ in interpolant time t = t(τ):
- zero-length blocks (half of them): τ_s = τ_t ~ U[0, 1] stratified; target = the frozen teacher's
  D = softmax(teacher(x_s, τ_s)) (soft labels);
- 0→1 blocks (a fixed fraction `frac_01` of all blocks): τ_s = 0, τ_t = 1 (γ = 0);
- the rest: gap d ~ U[0, 1] stratified, τ_s = U·(1−d), τ_t = τ_s + d;
- off-diagonal target, no grad, live student weights: midpoint τ_u = (τ_s+τ_t)/2, A = δ_{s,u}(x_s),
  X_su = ((1−u)/(1−s))·x_s + ((u−s)/(1−s))·A, B = δ_{u,t}(X_su), target = γ·A + (1−γ)·B with
  γ = (1−t)(u−s)/((1−u)(t−s));
- a τ-gated student (`config.tau_gated_input`) sees no state at τ_s = 0, so its δ_{0,t} is a function of the
  context alone, and the soft CE's minimiser is the noise average of the exact map's δ_{0,t}(x_0), which is
  E[x_1 | context] for every t (E X_{0,t}(x_0) = t·E x_1 and E x_0 = 0): the teacher's D(·, 0). Its 0→1 blocks
  take that target instead of the two half-jumps;
- `data_weight` w mixes the data label into every target that is the teacher's D: (1 − w)·D + w·onehot(label).
  D estimates E[x_1 | state, context], of which the label is an unbiased one-sample estimate: w > 0 trades the
  teacher's bias for the data's variance, and w = 1 trains those blocks on the data alone (the flow-matching
  diagonal of self-distillation), so the student's one step is no longer capped at the teacher's;
- `reachable`: the 0→1 blocks' loss only at the slots verification reaches, those whose one-step draft prefix
  (the student's argmax) equals the data labels, as `train flow --reachable` trains the teacher's one step;
- loss: slot-weighted soft cross-entropy −Σ_v target_v·log δ̂_{s,t}(x_s)_v, w_k = exp(−(k−1)/7).
Roles are assigned per anchor column (all rows share them) when A ≥ 2, so the teacher runs only on the
zero-length columns and the two extra student passes only on the others.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from flashmap_ext.checks import check_real
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap.flow import Clock, flow_map_jump, semigroup_weight
from flashmap_ext.train.dflash import reachable_slots
from flashmap_ext.train.flow import (
    IGNORE,
    block_metrics,
    chunked,
    noisy_states,
    prepare_batch,
    stratified_uniform,
    unwrap,
    weighted_mean,
)


def make_student(teacher: FlashMapDrafter) -> FlashMapDrafter:
    """A two-time student initialised from a flow teacher (`config.two_time=False`): every weight copied,
    the second time embedder new with its last Linear zeroed, so δ_{s,t} = D_s for all t and the
    student's one-step jump X_{s,t} is the teacher's Euler step (FMLM `initialize_student_from_teacher`).
    The student shares the teacher's target tables and has its dtype, device and train/eval mode."""
    if teacher.config.two_time:
        raise ValueError("teacher: must be a flow model (config.two_time=False); a two-time model's "
                         "second embedder cannot be zeroed without changing its function")
    student = FlashMapDrafter(dataclasses.replace(teacher.config, two_time=True))
    student.to(device=teacher.slot_pos.device, dtype=teacher.dtype)
    missing, unexpected = student.load_state_dict(teacher.state_dict(), strict=False)
    if unexpected or any(not k.startswith("t_embedder.") for k in missing):
        raise RuntimeError(f"make_student: unexpected state mismatch: missing={missing} unexpected={unexpected}")
    nn.init.zeros_(student.t_embedder.mlp[2].weight)
    nn.init.zeros_(student.t_embedder.mlp[2].bias)
    student.attach_tables(teacher.tables)
    return student.train(teacher.training)


def assign_roles(batch_size: int, num_anchors: int, frac_01: float,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(zero_length [B, A] bool, zero_to_one [B, A] bool) on CPU with deterministic counts.

    Half the blocks are zero-length: ⌊A/2⌋ random anchor columns (or ⌊B/2⌋ random rows when A = 1);
    round(frac_01·B·A) of the remaining blocks, chosen at random, jump 0→1. ValueError for frac_01 outside [0, 1].
    """
    frac_01 = check_real("frac_01", frac_01, 0.0, 1.0)
    zero = torch.zeros(batch_size, num_anchors, dtype=torch.bool)
    if num_anchors >= 2:
        zero[:, torch.randperm(num_anchors, generator=generator, device=generator.device)[:num_anchors // 2].cpu()] = True
    else:
        zero[torch.randperm(batch_size, generator=generator, device=generator.device)[:batch_size // 2].cpu()] = True
    off = (~zero).flatten().nonzero().flatten()
    n01 = min(round(frac_01 * batch_size * num_anchors), off.numel())
    pick = off[torch.randperm(off.numel(), generator=generator, device=generator.device)[:n01].cpu()]
    one = torch.zeros(batch_size * num_anchors, dtype=torch.bool)
    one[pick] = True
    return zero, one.view(batch_size, num_anchors)


def sample_times(zero: torch.Tensor, one: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ_s, τ_t) [B, A] fp64 on CPU for the roles of `assign_roles` (module docstring)."""
    tau_s, tau_t = torch.zeros(zero.shape, dtype=torch.float64), torch.ones(zero.shape, dtype=torch.float64)
    n_zero, generic = int(zero.sum()), ~zero & ~one
    diag = stratified_uniform(n_zero, generator).cpu()
    tau_s[zero], tau_t[zero] = diag, diag
    n_gen = int(generic.sum())
    gap = stratified_uniform(n_gen, generator).cpu()
    start = torch.rand(n_gen, generator=generator, device=generator.device, dtype=torch.float64).cpu() * (1 - gap)
    tau_s[generic], tau_t[generic] = start, start + gap
    return tau_s, tau_t


def _block_times(batch_size: int, num_anchors: int, frac_01: float, generator: torch.Generator, clock: Clock,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Roles (CPU) and times on `device`: τ_s, τ_u = (τ_s+τ_t)/2, τ_t and interpolant times s, u, t [B, A] fp64."""
    zero, one = assign_roles(batch_size, num_anchors, frac_01, generator)
    tau_s, tau_t = sample_times(zero, one, generator)
    times = {"tau_s": tau_s, "tau_t": tau_t, "tau_u": (tau_s + tau_t) / 2}
    times.update({n: clock.t_of_tau(times["tau_" + n]) for n in ("s", "u", "t")})
    return zero, one, {k: v.to(device) for k, v in times.items()}


def _column_groups(zero: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """[(anchor columns, kind)] with kind 'zero', 'jump' or 'mixed' (A = 1: rows differ)."""
    has_zero, has_jump = zero.any(0), (~zero).any(0)
    groups = [(torch.nonzero(has_zero & ~has_jump).flatten(), "zero"),
              (torch.nonzero(has_jump & ~has_zero).flatten(), "jump"),
              (torch.nonzero(has_zero & has_jump).flatten(), "mixed")]
    return [(cols, kind) for cols, kind in groups if cols.numel()]


def _half_jumps(model: nn.Module, drafter: FlashMapDrafter, b: dict, cols: torch.Tensor, x_s: torch.Tensor,
                times: dict, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of A = δ_{s,u}(x_s) and B = δ_{u,t}(X_su) for anchor columns `cols` (no grad)."""
    anchors, x = b["anchor_pos"][:, cols], x_s[:, cols]
    tau_s, tau_u, tau_t = (times[k][:, cols].float() for k in ("tau_s", "tau_u", "tau_t"))
    h_a = model(b["taps"], b["input_ids"], anchors, x, tau_s, tau_u, return_hidden=True)
    (a_state,) = chunked(lambda h: (drafter.probs_to_state(torch.softmax(drafter.logits_from_hidden(h), -1)),),
                         h_a, chunk=chunk)
    k = x.shape[2]
    s, u = (times[n][:, cols, None].expand(-1, -1, k) for n in ("s", "u"))
    x_su = flow_map_jump(x, a_state, s, u)
    return h_a, model(b["taps"], b["input_ids"], anchors, x_su, tau_u, tau_t, return_hidden=True)


def _teacher_target(teacher: FlashMapDrafter, h: dict, data_weight: float) -> torch.Tensor:
    """(1 − w)·softmax(teacher logits) + w·onehot(h["labels"]) [B, a, K, V_s] fp32 (ignored labels count as
    row 0: their slots are masked out of the loss)."""
    teacher_d = torch.softmax(teacher.logits_from_hidden(h["teacher"]), -1)
    if data_weight == 0:
        return teacher_d
    onehot = nn.functional.one_hot(h["labels"].clamp_min(0), teacher_d.shape[-1]).to(teacher_d.dtype)
    return (1 - data_weight) * teacher_d + data_weight * onehot


def _soft_targets(kind: str, student: FlashMapDrafter, teacher: FlashMapDrafter, h: dict,
                  data_weight: float = 0.0) -> torch.Tensor:
    """Target distributions [B, a, K, V_s] fp32 for one column group (module docstring): the teacher's D (mixed
    with the data label by `data_weight`) where h["zero"] (zero-length) or h["start"] (a gated student's 0→1
    jump), the semigroup target elsewhere."""
    if "teacher" in h:
        teacher_d = _teacher_target(teacher, h, data_weight)
        if kind == "zero":
            return teacher_d
    gamma = h["gamma"][..., None, None]
    a = torch.softmax(student.logits_from_hidden(h["a"]), -1)
    target = gamma * a + (1 - gamma) * torch.softmax(student.logits_from_hidden(h["b"]), -1)
    if "teacher" not in h:
        return target
    return torch.where((h["zero"] | h["start"])[..., None, None], teacher_d, target)


def _group_soft_ce(kind: str, student: FlashMapDrafter, teacher: FlashMapDrafter, h: dict,
                   chunk: int, data_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(soft CE [B, a, K] with grad, student argmax [B, a, K]) for one column group, chunked."""
    names = sorted(h)

    def fn(*tensors):
        parts = dict(zip(names, tensors))
        logp = torch.log_softmax(student.logits_from_hidden(parts["student"]), -1)
        with torch.no_grad():
            target = _soft_targets(kind, student, teacher, parts, data_weight)
        return -(target * logp).sum(-1), logp.argmax(-1)

    return tuple(chunked(fn, *(h[n] for n in names), chunk=chunk))


def distill_loss(student: nn.Module, teacher: FlashMapDrafter, batch: dict, generator: torch.Generator,
                 frac_01: float = 1 / 16, *, data_weight: float = 0.0, reachable: bool = False,
                 anchor_chunk: int = 16) -> tuple[torch.Tensor, dict]:
    """Semigroup flow-map distillation loss on one batch (module docstring; DESIGN.md §4).

    student: a two-time FlashMapDrafter (`make_student`), optionally DDP-wrapped (called as `student(...)`).
    teacher: the frozen flow model (evaluated without grad). batch: as `train.flow.flow_loss`.
    frac_01: fraction of all blocks that jump 0→1 (default 1/16). generator: CPU source of roles, τ, noise.
    data_weight: weight w in [0, 1] of the data label in the teacher's targets (module docstring; default 0).
    reachable: the 0→1 blocks' loss only at the slots verification reaches (module docstring).
    Returns (scalar loss with grad, {loss, loss_zero, loss_jump, acc_01, tokens}): loss_zero / loss_jump
    are the weighted soft CE of the zero-length and the other blocks; acc_01 is top-1 accuracy of the
    0→1 blocks against the data labels.
    """
    data_weight = check_real("data_weight", data_weight, 0.0, 1.0)
    drafter = unwrap(student)
    b = prepare_batch(drafter, batch)
    device, (B, A) = b["labels"].device, b["anchor_pos"].shape
    if drafter.config.state_loglik or teacher.config.state_loglik:
        raise NotImplementedError("distill: state_loglik drafters are not distilled (DESIGN.md §4)")
    if drafter.clock.name != teacher.clock.name or drafter.t_mid != teacher.t_mid:
        raise ValueError(f"student/teacher: different clocks ({drafter.clock.name} vs {teacher.clock.name})")
    zero, one, times = _block_times(B, A, frac_01, generator, drafter.clock, device)
    x_s = noisy_states(drafter, b["labels"], times["s"], generator)
    gamma = semigroup_weight(times["s"], times["u"], times["t"]).float()
    hidden = student(b["taps"], b["input_ids"], b["anchor_pos"], x_s, times["tau_s"].float(),
                     times["tau_t"].float(), return_hidden=True)
    ce, pred = hidden.new_zeros(b["labels"].shape, dtype=torch.float32), torch.zeros_like(b["labels"])
    start = one & drafter.config.tau_gated_input  # 0→1 jumps whose target is the teacher's D(·, 0)
    for cols, kind in _column_groups(zero):
        cols_d = cols.to(device)
        h = {"student": hidden[:, cols_d], "gamma": gamma[:, cols_d], "zero": zero.to(device)[:, cols_d],
             "start": start.to(device)[:, cols_d], "labels": b["state_labels"][:, cols_d]}
        with torch.no_grad():
            if kind != "jump" or bool(start[:, cols].any()):
                h["teacher"] = teacher(b["taps"], b["input_ids"], b["anchor_pos"][:, cols_d], x_s[:, cols_d],
                                       times["tau_s"][:, cols_d].float(), times["tau_s"][:, cols_d].float(),
                                       return_hidden=True)
            if kind != "zero":
                h["a"], h["b"] = _half_jumps(student, drafter, b, cols_d, x_s, times, anchor_chunk)
        group_ce, group_pred = _group_soft_ce(kind, drafter, teacher, h, anchor_chunk, data_weight)
        ce, pred = ce.index_copy(1, cols_d, group_ce), pred.index_copy(1, cols_d, group_pred)
    valid = b["state_labels"] != IGNORE
    zero_d, one_d = zero.to(device)[..., None], one.to(device)[..., None]
    reach = reachable_slots(pred == b["state_labels"]) | ~one_d if reachable else True
    loss = weighted_mean(ce, valid & reach)
    with torch.no_grad():
        metrics = {"loss": float(loss), "loss_zero": float(weighted_mean(ce, valid & zero_d)),
                   "loss_jump": float(weighted_mean(ce, valid & ~zero_d)),
                   "acc_01": block_metrics(loss, pred == b["state_labels"], valid & one_d)["acc"],
                   "tokens": int(valid.sum())}
    return loss, metrics


def distill_loss_fn(teacher: FlashMapDrafter, frac_01: float = 1 / 16, data_weight: float = 0.0,
                    anchor_chunk: int = 16) -> Callable[[nn.Module, dict, torch.Generator], tuple]:
    """`loss_fn(model, batch, generator)` for train.trainer with a fixed frozen teacher."""
    teacher.requires_grad_(False).eval()

    def loss_fn(model: nn.Module, batch: dict, generator: torch.Generator):
        return distill_loss(model, teacher, batch, generator, frac_01, data_weight=data_weight,
                            anchor_chunk=anchor_chunk)
    return loss_fn

"""Typed Python wrappers over torch.ops.flashmap.* and their fake (meta) kernels.

Dimension letters: B batch, K draft length (slots), V vocabulary, d hidden size.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Union

import torch

from flashmap_ext.ops.status import (
    STATUS_BAD_DRAFT_PROB,
    STATUS_BAD_PARAMS,
    STATUS_ERRORS,
    STATUS_NO_FINITE,
    STATUS_NONFINITE,
)

_verify_op = torch.ops.flashmap.verify.scalars  # [B] tensors or values (registration.cpp)

Scalar = Union[int, float, torch.Tensor]


class VerifyOutput(NamedTuple):
    tokens: torch.Tensor        # [B, K+1] int64, -1 after the emitted prefix
    num_accepted: torch.Tensor  # [B] int32, accepted drafts (bonus excluded)
    status: torch.Tensor        # [B] int32 bit flags, 0 = clean row


def _verify_shapes(target_logits, draft_tokens):
    torch._check(target_logits.dim() == 3, lambda: "target_logits must be [B, K+1, V]")
    B, K1, _ = target_logits.shape
    torch._check(draft_tokens.dim() == 2 and draft_tokens.shape[1] == K1 - 1,
                 lambda: "draft_tokens must be [B, K]")
    dev = target_logits.device
    return (torch.empty((B, K1), dtype=torch.int64, device=dev),
            torch.empty((B,), dtype=torch.int32, device=dev),
            torch.empty((B,), dtype=torch.int32, device=dev))


@torch.library.register_fake("flashmap::verify")
def _verify_fake(target_logits, draft_tokens, temperature, top_k, top_p, seed, position,
                 draft_probs=None, valid_vocab=0, uniforms=None):
    return _verify_shapes(target_logits, draft_tokens)


@torch.library.register_fake("flashmap::verify.scalars")
def _verify_scalars_fake(target_logits, draft_tokens, temperature, top_k, top_p, seed, position,
                         temperature_value, top_k_value, top_p_value, seed_value, position_value,
                         draft_probs=None, valid_vocab=0, uniforms=None):
    return _verify_shapes(target_logits, draft_tokens)


_INT32_MAX, _INT64 = 2**31 - 1, (-2**63, 2**63)


def _check_scalar(name: str, value, dtype: torch.dtype):
    """A python scalar argument, validated (host-side, no sync): integers for the int parameters, NaN and
    out-of-range values rejected with the argument's name (the loop's domains: temperature finite >= 0,
    top_p in (0, 1], top_k >= 0); top_k above int32 (= off) is clamped."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"verify: {name} must be a python number or a [B] tensor, got {type(value).__name__}")
    if not dtype.is_floating_point:
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"verify: {name} must be an integer, got {value!r}")
        value = int(value)
        if name == "top_k":
            if value < 0:
                raise ValueError(f"verify: top_k must be >= 0 (0 = off), got {value}")
            return min(value, _INT32_MAX)  # >= V is off already
        if not 0 <= value < _INT64[1]:  # seed: an int64 Philox key; position: an absolute position
            raise ValueError(f"verify: {name} must be in [0, 2**63), got {value}")
        return value
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"verify: {name} is NaN")
    if name == "temperature" and not 0.0 <= value < math.inf:
        raise ValueError(f"verify: temperature must be finite and >= 0 (0 = greedy), got {value}")
    if name == "top_p" and not 0.0 < value <= 1.0:
        raise ValueError(f"verify: top_p must be in (0, 1] (1 = off), got {value}")
    return value


# Domains of the per-row parameters: name -> (bad-value test, expected range), as the scalar checks.
_ROW_DOMAINS = {
    "temperature": (lambda t: ~((t >= 0) & (t < math.inf)), "finite and >= 0 (0 = greedy)"),
    "top_k": (lambda t: t < 0, ">= 0 (0 = off)"),
    "top_p": (lambda t: ~((t >= 0) & (t <= 1)), "in [0, 1] (1 = off)"),
    "seed": (lambda t: t < 0, "in [0, 2**63)"),
    "position": (lambda t: t < 0, "in [0, 2**63)"),
}
_KERNEL_CHECKED = ("temperature", "top_k", "top_p")  # the rows the CUDA kernel flags with status bit 16


def _check_row_values(name: str, t: torch.Tensor) -> None:
    """ValueError naming `name`, its range, shape and dtype if a row of the [B] tensor `t` is outside its
    domain. Reads the values: a host sync on CUDA, so `verify` calls it eagerly for CPU tensors only (on
    CUDA the kernel flags such rows with STATUS_BAD_PARAMS instead)."""
    test, expected = _ROW_DOMAINS[name]
    bad = test(t)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        values = t[bad].tolist()[:8]
        raise ValueError(f"verify: {name} must be {expected} in every row of the [B] = [{t.shape[0]}] "
                         f"{str(t.dtype).removeprefix('torch.')} tensor; rows {rows[:8]} hold {values}")


def _per_row(name: str, value: Scalar, B: int, dtype: torch.dtype, device) -> torch.Tensor | int | float:
    """A python scalar -> the checked number (passed to the kernel by value), a [B] tensor -> a contiguous
    [B] tensor of `dtype` on `device`; values checked on the host for scalars and CPU tensors (see
    _check_row_values)."""
    if not isinstance(value, torch.Tensor):
        return _check_scalar(name, value, dtype)
    if value.shape != (B,):
        raise ValueError(f"verify: {name} must be a python scalar or a [B] = [{B}] tensor, "
                         f"got shape {tuple(value.shape)}")
    if value.dtype.is_floating_point != dtype.is_floating_point or value.dtype == torch.bool:
        kind = "a floating-point" if dtype.is_floating_point else "an integer"
        raise TypeError(f"verify: {name} must be {kind} tensor (got {value.dtype})")
    if value.device != torch.device(device):
        raise ValueError(f"verify: {name} is on {value.device}, target_logits on {device}")
    if name == "top_k" and value.dtype == torch.int64:  # no wrap-around: keep the sign, clamp like scalars
        value = value.clamp(-1, _INT32_MAX)
    value = value.to(dtype).contiguous()
    if name in _ROW_DOMAINS and value.device.type == "cpu" and not torch.compiler.is_compiling():
        _check_row_values(name, value)
    return value


# The value verify.scalars gets for a parameter passed as a [B] tensor (unused by the kernels then).
_SCALAR_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "position": 0}


def _check_shapes(target_logits, draft_tokens, draft_probs, uniforms):
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 3:
        raise ValueError("verify: target_logits must be a [B, K+1, V] tensor")
    if target_logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"verify: target_logits must be bf16, fp16 or fp32 (got {target_logits.dtype})")
    if target_logits.is_meta:
        raise ValueError("verify: target_logits is a meta tensor (no values to verify): pass a cpu or cuda tensor")
    if not isinstance(draft_tokens, torch.Tensor):
        raise TypeError(f"verify: draft_tokens must be a [B, K] int64 tensor, "
                        f"got {type(draft_tokens).__name__}")
    for name, t in (("draft_tokens", draft_tokens), ("draft_probs", draft_probs), ("uniforms", uniforms)):
        if t is not None and t.device != target_logits.device:  # else a meta tensor reaches the fake kernel
            raise ValueError(f"verify: {name} is on {t.device}, target_logits on {target_logits.device}")
    B, K1, V = target_logits.shape
    if B < 1 or V < 1:
        raise ValueError(f"verify: target_logits [B, K+1, V] needs B >= 1 and V >= 1, got {(B, K1, V)}")
    if draft_tokens.shape != (B, K1 - 1):
        raise ValueError(f"verify: draft_tokens must be [B, K] = [{B}, {K1 - 1}] (target_logits is "
                         f"[B, K+1, V] = {list(target_logits.shape)}), got {list(draft_tokens.shape)}")
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"verify: draft_tokens must be int64 (got {draft_tokens.dtype})")
    if draft_probs is not None:
        if draft_probs.shape != (B, K1 - 1, V):
            raise ValueError(f"verify: draft_probs must be [B, K, V] = [{B}, {K1 - 1}, {V}], "
                             f"got {list(draft_probs.shape)}")
        if draft_probs.dtype != torch.float32:
            raise TypeError(f"verify: draft_probs must be float32 (got {draft_probs.dtype})")
    if uniforms is not None:
        _check_uniforms(uniforms, B, K1)


def _check_uniforms(uniforms: torch.Tensor, B: int, K1: int) -> None:
    """Injected coins: [B, K+1] float64 in [0, 1) (values read on the host for CPU tensors only)."""
    if uniforms.shape != (B, K1):
        raise ValueError(f"verify: uniforms must be [B, K+1] = [{B}, {K1}], got {list(uniforms.shape)}")
    if uniforms.dtype != torch.float64:
        raise TypeError(f"verify: uniforms must be float64 coins in [0, 1) (got {uniforms.dtype})")
    if uniforms.device.type == "cpu" and not torch.compiler.is_compiling() \
            and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError(f"verify: uniforms must be in [0, 1), got values in "
                         f"[{uniforms.min().item()}, {uniforms.max().item()}]")


def _check_draft_ids(draft_tokens: torch.Tensor, V: int) -> None:
    """ValueError naming draft_tokens and V if an id is outside [0, V) and not -1 (reads the values: a host
    sync on CUDA, so `verify` calls it with check=True only)."""
    bad = (draft_tokens < -1) | (draft_tokens >= V)
    if bool(bad.any()):
        where = torch.nonzero(bad)[:8].tolist()
        raise ValueError(f"verify: draft_tokens must be ids in [0, V) = [0, {V}) or -1 (no draft); "
                         f"[row, slot] {where} hold {draft_tokens[bad][:8].tolist()}")


def _rows(status: torch.Tensor, bits: int) -> list:
    rows = torch.nonzero((status & bits) != 0).flatten().tolist()
    return rows[:16] + (["..."] if len(rows) > 16 else [])


def _raise_on_bad_rows(status: torch.Tensor, params: dict) -> None:
    if not bool(((status & STATUS_ERRORS) != 0).any()):  # host sync: only with check=True
        return
    if bool(((status & STATUS_BAD_PARAMS) != 0).any()):  # [B] tensors on CUDA, checked by the kernel
        for name in _KERNEL_CHECKED:
            if isinstance(params[name], torch.Tensor):
                _check_row_values(name, params[name])
    problems = []
    if rows := _rows(status, STATUS_NONFINITE | STATUS_NO_FINITE):
        problems.append(f"target_logits rows {rows} hold NaN or +inf logits, or a slot with no finite logit "
                        "among the valid ids (status bits 1 = NaN/+inf, 2 = no finite logit)")
    if rows := _rows(status, STATUS_BAD_DRAFT_PROB):
        problems.append(f"draft_probs rows {rows} give a drafted token x a probability q(x) outside (0, 1] "
                        "(NaN, zero, negative or > 1) in a sampling row, but x was sampled from q "
                        "(status bit 8)")
    raise ValueError("verify: " + "; ".join(problems or [f"error status {status.tolist()}"]))


def _position_or_zero(position: Optional[Scalar], temperature: Scalar,
                      which: str = "slot 0 (the anchor's)") -> Scalar:
    """`position`, or 0 when it is left out of a greedy call (greedy rows draw no coins); ValueError naming
    `position` (the absolute position of `which`) when a sampling call leaves it out. A bad temperature is left
    to its own check."""
    if position is not None:
        return position
    if isinstance(temperature, torch.Tensor):  # values read on the CPU only (no host sync on CUDA)
        sampling = temperature.device.type != "cpu" or torch.compiler.is_compiling() or bool((temperature > 0).any())
    else:
        sampling = isinstance(temperature, numbers.Real) and not isinstance(temperature, bool) and temperature > 0
    if sampling:
        raise ValueError("verify: position is required when sampling (temperature > 0): the coins are keyed by "
                         "(seed, position), so calls without it would all draw the same ones; pass the absolute "
                         f"position of {which}")
    return 0


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, *, temperature: Scalar = 0.0,
           top_k: Scalar = 0, top_p: Scalar = 1.0, seed: Scalar = 0, position: Optional[Scalar] = None,
           draft_probs: Optional[torch.Tensor] = None, valid_vocab: Optional[int] = None,
           uniforms: Optional[torch.Tensor] = None, check: bool = True) -> VerifyOutput:
    """Fused acceptance step of chain speculative decoding (DESIGN.md §3.1).

    Lossless rejection sampling after Leviathan et al. 2023 (arXiv:2211.17192) and Chen et al. 2023
    (arXiv:2302.01318). Per batch row, slots i = 0..K-1 are judged in order until the first rejection:
    greedy rows (temperature == 0) accept iff the draft equals argmax of row i (lowest index on ties,
    as torch.argmax) and emit that argmax at the first mismatch. Sampling rows use p = softmax(logits / T)
    filtered by top-k then top-p (ties at either threshold kept) and renormalised:
    point-mass drafts (draft_probs None) accept iff u < p(x) and on rejection emit a sample of p with x
    removed; drafts with draft_probs q accept iff u·q(x) < p(x) and emit a sample of max(p - q, 0)
    normalised. When all K are accepted, the bonus token comes from row K. K = 0 is the plain sampler.

    Args:
        target_logits: [B, K+1, V] bf16/fp16/fp32, stride(-1) == 1 preferred — target logits of the
            anchor and the K drafts (row i scores slot i).
        draft_tokens: [B, K] int64 — drafted ids in [0, V); -1 means no draft: that slot and every
            later one are rejected (so is an id in [valid_vocab, V), a padding row). With check=True (the
            default) any other id (< -1 or >= V) raises ValueError naming draft_tokens and V; with
            check=False it is not read on the host and is treated as -1.
        temperature: scalar or [B] fp32, finite and >= 0 in every row (NaN, negative or +inf is an
            error); 0 = greedy row; tiny values (1e-6) still sample.
        top_k: scalar or [B] int32; 0 (or >= valid_vocab) = off; negative is an error.
        top_p: scalar in (0, 1] or [B] fp32 in [0, 1]; 1 = off, a tensor's 0 keeps only the top id;
            outside is an error. Out-of-domain scalars and CPU tensors raise ValueError naming the
            argument at once; [B] tensors on CUDA are checked by the kernel without a host sync: the
            row gets status bit 16 (raised when check=True).
        seed: scalar or [B] int64 — Philox key of the row's coins.
        position: scalar or [B] int64 — absolute position of slot 0, the anchor (as
            `draft_block`'s position: the row's committed length); slot i's coins use counter
            (position + i, stream), streams ACCEPT = 0 and RESAMPLE = 1 (the drafter owns 2). Never
            keyed by batch row: a row's output does not depend on its batch-mates. Required when a row
            samples (temperature > 0; a CUDA [B] temperature always counts as sampling): calls without
            it would all draw the same coins. Greedy calls may leave it out.
        draft_probs: optional [B, K, V] fp32 — the q each draft was really sampled from. In a sampling
            row, q(x) at each in-range draft x must be in (0, 1], else the row gets status bit 8 (only
            q(x), read by the accept test anyway, is checked; other entries are trusted, a NaN there
            weighs 0 in max(p - q, 0)). Greedy rows ignore draft_probs.
        valid_vocab: ids >= valid_vocab (padding rows of the LM head) are never emitted; default V.
        uniforms: optional [B, K+1] fp64 in [0, 1) — injected coins (tests): K accept coins, then the
            one resample coin used at whichever slot emits.
        check: True (the default): raise ValueError for draft ids outside [0, V) other than -1 and
            naming the rows whose status has an error bit (forces a host sync; a CUDA-graph-captured
            loop passes False and reads `status` itself).

    Returns:
        VerifyOutput(tokens [B, K+1] int64 (accepted drafts, then the emitted token, then -1),
        num_accepted [B] int32 (bonus excluded), status [B] int32 bit flags: 1 NaN/+inf logit,
        2 a slot without a finite logit, 8 a draft_probs q(x) outside (0, 1], 16 a temperature / top_k /
        top_p row outside its domain (all errors, over all K+1 slots; the row gets token 0 and
        num_accepted 0), 4 residual mass was 0 and p was sampled instead (informational)).

    Raises:
        ValueError / TypeError naming the argument for bad shapes, dtypes or devices; with check=True:
        ValueError naming draft_tokens for ids outside [0, V) other than -1, and naming the rows for
        error statuses.
    """
    _check_shapes(target_logits, draft_tokens, draft_probs, uniforms)
    B, _, V = target_logits.shape
    dev = target_logits.device
    if valid_vocab is not None and not 1 <= int(valid_vocab) <= V:
        raise ValueError(f"verify: valid_vocab must be in [1, V] = [1, {V}], got {valid_vocab}")
    if check:
        _check_draft_ids(draft_tokens, V)
    params = {name: _per_row(name, value, B, dtype, dev) for name, value, dtype in (
        ("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
        ("top_p", top_p, torch.float32), ("seed", seed, torch.int64))}
    params["position"] = _per_row("position", _position_or_zero(position, params["temperature"]), B, torch.int64, dev)
    tensors = [v if isinstance(v, torch.Tensor) else None for v in params.values()]
    values = [_SCALAR_DEFAULTS[k] if isinstance(v, torch.Tensor) else v for k, v in params.items()]
    out = _verify_op(target_logits, draft_tokens, *tensors, *values,
                     draft_probs, V if valid_vocab is None else int(valid_vocab), uniforms)
    result = VerifyOutput(*out)
    if check:
        _raise_on_bad_rows(result.status, params)
    return result


def sample(logits: torch.Tensor, *, temperature: Scalar = 0.0, top_k: Scalar = 0, top_p: Scalar = 1.0,
           seed: Scalar = 0, position: Optional[Scalar] = None, valid_vocab: Optional[int] = None,
           check: bool = True) -> torch.Tensor:
    """Plain (non-speculative) sampler: `verify` with K = 0, the same filters and the RESAMPLE stream.

    Args: logits [B, V] bf16/fp16/fp32; the rest as in `verify`, position = the absolute position of the token
        whose logits row this is (the first new token after a prompt of S tokens: S − 1). Its draw is
        `verify`'s slot-0 draw at that position, so the next round's `verify` at the anchor's position S
        draws afresh; passing S here would reuse that draw and bias the output.
    Returns: tokens [B] int64 (argmax for temperature 0, lowest index on ties).
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        got = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"sample: logits must be a [B, V] tensor, got {got}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"sample: logits must be bf16, fp16 or fp32 (got {logits.dtype})")
    if logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"sample: logits [B, V] needs B >= 1 and V >= 1, got {list(logits.shape)}")
    drafts = torch.empty((logits.shape[0], 0), dtype=torch.int64, device=logits.device)
    try:
        position = _position_or_zero(position, temperature, "the token whose logits row is sampled (S − 1 for the "
                                     "first new token after a prompt of S tokens)")
        out = verify(logits.unsqueeze(1), drafts, temperature=temperature, top_k=top_k, top_p=top_p,
                     seed=seed, position=position, valid_vocab=valid_vocab, check=check)
    except (ValueError, TypeError) as err:  # verify's argument checks: name this function and its `logits`
        message = str(err).removeprefix("verify: ").replace("target_logits", "logits")
        raise type(err)(f"sample: {message}") from None
    return out.tokens[:, 0]


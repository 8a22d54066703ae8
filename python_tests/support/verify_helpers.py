"""Shared inputs and comparisons for the verify tests. Expected values always come from
flashmap_ext/ops/verify_reference.py (float64) or from exact distributions, never from the op under test."""
from __future__ import annotations

import math

import numpy as np
import torch

from flashmap_ext import ops
from flashmap_ext.ops.verify_reference import verify_reference_detailed

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FRAGILE = 2e-6  # decisions closer than this to their threshold (relative) may flip between fp32 and fp64


def per_row(B, temperature=0.0, top_k=0, top_p=1.0, seed=None, position=None, device="cpu"):
    """The five [B] parameter tensors of the op schema (temperature/top_k/top_p broadcast from scalars)."""
    def full(v, dtype):
        return v.to(device, dtype) if isinstance(v, torch.Tensor) else torch.full((B,), v, dtype=dtype,
                                                                                 device=device)
    seed = torch.arange(B) * 7919 + 11 if seed is None else seed
    position = torch.arange(B) * 3 + 100 if position is None else position
    return dict(temperature=full(temperature, torch.float32), top_k=full(top_k, torch.int32),
                top_p=full(top_p, torch.float32), seed=full(seed, torch.int64),
                position=full(position, torch.int64))


def random_case(B, K, V, *, dtype=torch.float32, accept_frac=0.7, scale=3.0, gen_seed=0):
    """Logits [B, K+1, V] and drafts [B, K] where ~accept_frac of drafts are the row argmax."""
    g = torch.Generator().manual_seed(gen_seed)
    logits = (torch.randn(B, K + 1, V, generator=g) * scale).to(dtype)
    drafts = torch.randint(0, V, (B, K), generator=g)
    best = logits[:, :K].float().argmax(-1)
    take = torch.rand(B, K, generator=g) < accept_frac
    drafts[take] = best[take]
    return logits, drafts


def check_against_reference(logits, drafts, params, *, draft_probs=None, valid_vocab=None, uniforms=None,
                            device="cpu", max_fragile=0.1):
    """Runs the op on `device` and the float64 reference on CPU; asserts equality on every row whose
    decisive coins are not within FRAGILE of their thresholds. Returns the op's output."""
    dev = lambda t: None if t is None else t.to(device)
    out = ops.verify(dev(logits), dev(drafts), draft_probs=dev(draft_probs), valid_vocab=valid_vocab,
                     uniforms=dev(uniforms), check=False, **{k: dev(v) for k, v in params.items()})
    cpu = {k: v.cpu() for k, v in params.items()}
    tokens, num_acc, status, margin = verify_reference_detailed(
        logits.cpu(), drafts.cpu(), cpu["temperature"], cpu["top_k"], cpu["top_p"], cpu["seed"],
        cpu["position"], None if draft_probs is None else draft_probs.cpu(), valid_vocab,
        None if uniforms is None else uniforms.cpu())
    solid = margin >= FRAGILE
    assert (~solid).float().mean() <= max_fragile, f"too many fragile rows: {int((~solid).sum())}"
    got = (out.tokens.cpu(), out.num_accepted.cpu(), out.status.cpu())
    for name, g, e in zip(("tokens", "num_accepted", "status"), got, (tokens, num_acc, status)):
        bad = torch.nonzero(solid & (g != e).reshape(g.shape[0], -1).any(1)).flatten().tolist()
        assert not bad, f"{name} differs from the reference in rows {bad[:8]}: got {g[bad[:3]].tolist()}, " \
                        f"expected {e[bad[:3]].tolist()}"
    return out


def chi_square(observed: np.ndarray, expected_prob: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square of counts against probabilities, bins with expected count < 5 merged into
    one. Returns (statistic, degrees of freedom). Mass outside the expected support gets +inf."""
    n = observed.sum()
    expected = expected_prob * n
    if observed[expected_prob == 0].sum() > 0:
        return math.inf, 1
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), max(len(obs) - 1, 1)


def assert_chi_square(observed, expected_prob, what=""):
    """Passes iff chi2 < df + 10·sqrt(2·df) (≈10σ: no false alarms at fixed seeds, power for few-% bias)."""
    stat, df = chi_square(np.asarray(observed, dtype=np.float64), np.asarray(expected_prob, dtype=np.float64))
    threshold = df + 10 * math.sqrt(2 * df)
    assert stat < threshold, f"{what}: chi2 {stat:.1f} >= threshold {threshold:.1f} (df {df})"
    return stat

"""Flow math of the FlashMap drafter (DESIGN.md §4): the τ↔t clock, the interpolant, the flow-map jump,
d-space noise (its random stream is rng.drafter_xi).

Conventions: noise at t = 0, data at t = 1 (FLM, Lee et al. 2026, arXiv:2602.16813). `t` is interpolant
time; `τ` ("fraction of initial decoding errors removed") is what the network is conditioned on. Every
formula works in V-space (one-hot states) and in d-space (states seen through the frozen embedding,
`Eᵀx`), because the interpolant and the jump are linear in the state.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

_TABLE_POINTS = 20_001
_HERMITE_NODES = 400  # τ error for V = 151,936 vs adaptive quadrature: 100 nodes (FLM code) 4e-5, 200: 4e-6, 400: 1e-8
_MONOTONE_RAMP = 1e-9  # τ ← (1−ε)·τ + ε·t: strictly increasing, endpoints unchanged (FLM adds (t−1)·1e-10)


@functools.lru_cache(maxsize=2)
def _gauss_hermite(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes z and weights w (Σw = 1) with Σ w·f(z) ≈ E_{z~N(0,1)}[f(z)], fp64 (numpy's hermgauss
    overflows beyond ~360 nodes). Nodes: eigenvalues of the Hermite Jacobi matrix (Golub & Welsch
    1969); weights: Christoffel numbers 1/Σ_k p_k(x)² from the orthonormal three-term recurrence."""
    off = torch.sqrt(torch.arange(1, n, dtype=torch.float64, device="cpu") / 2)
    x = torch.linalg.eigvalsh(torch.diag(off, 1) + torch.diag(off, -1))
    p_prev, p = torch.zeros_like(x), torch.full_like(x, np.pi ** -0.25)
    total = p * p
    for k in range(n - 1):  # p_{k+1} = sqrt(2/(k+1))·x·p_k − sqrt(k/(k+1))·p_{k−1}; overflow -> weight 0
        p_prev, p = p, np.sqrt(2.0 / (k + 1)) * x * p - np.sqrt(k / (k + 1)) * p_prev
        total = total + p * p
    return x * np.sqrt(2.0), (1.0 / total) / np.sqrt(np.pi)


def correct_decoding_prob(t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """P_c(t) = E_z[Φ(z + t/(1−t))^(V−1)], z ~ N(0, 1): the probability that argmax of
    x_t = (1−t)·ε + t·onehot(y) is y (FLM §3, blog "How to Generate Text in One Step" §7).

    Gauss–Hermite quadrature with 400 nodes in fp64. t: any shape, values in [0, 1] (t = 1 gives 1).
    """
    z, w = (x.to(t.device) for x in _gauss_hermite(_HERMITE_NODES))
    t = t.to(torch.float64)
    a = t / (1.0 - t).clamp_min(1e-300)
    log_phi = torch.special.log_ndtr(z + a[..., None])
    p = (w * torch.exp((vocab_size - 1) * log_phi)).sum(-1)
    return torch.where(t >= 1.0, torch.ones_like(p), p)


def tau_of_t_exact(t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """τ(t) = (V·P_c(t) − 1)/(V − 1), by quadrature (no table); fp64, same shape as t."""
    return (vocab_size * correct_decoding_prob(t, vocab_size) - 1.0) / (vocab_size - 1)


@functools.lru_cache(maxsize=8)
def _table(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_grid, tau_grid), both [20,001] fp64 on CPU, strictly increasing, τ(0) = 0 and τ(1) = 1 exactly."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    t = torch.linspace(0.0, 1.0, _TABLE_POINTS, dtype=torch.float64, device="cpu")
    tau = tau_of_t_exact(t, vocab_size).clamp(0.0, 1.0)
    tau = torch.cummax(tau, 0).values  # quadrature noise of ~1e-9 must not break monotonicity
    tau[0], tau[-1] = 0.0, 1.0
    tau = (1.0 - _MONOTONE_RAMP) * tau + _MONOTONE_RAMP * t
    return t, tau


def _interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear (hence monotone) interpolation of increasing (xp, fp) at x, clamped to the ends."""
    xp, fp = xp.to(x.device), fp.to(x.device)
    x64 = x.to(torch.float64).clamp(xp[0], xp[-1])
    i = torch.searchsorted(xp, x64.contiguous(), right=True).clamp(1, xp.numel() - 1)
    x0, x1, f0, f1 = xp[i - 1], xp[i], fp[i - 1], fp[i]
    return (f0 + (f1 - f0) * (x64 - x0) / (x1 - x0)).to(x.dtype)


def t_of_tau(tau: torch.Tensor | float, vocab_size: int) -> torch.Tensor:
    """Interpolant time t for clock τ (FLM §3.3), from a monotone table built once per V.

    tau: any shape, float, in [0, 1] (clamped). Returns t, same shape/dtype/device (float64 for a Python
    float). Exact at the ends: t(0) = 0, t(1) = 1. For V = 151,936: t(0.01) ≈ 0.675, t(0.5) ≈ 0.817,
    t(0.99) ≈ 0.873.
    """
    tau = tau if torch.is_tensor(tau) else torch.tensor(tau, dtype=torch.float64, device="cpu")
    t_grid, tau_grid = _table(vocab_size)
    return _interp(tau, tau_grid, t_grid)


def tau_of_t(t: torch.Tensor | float, vocab_size: int) -> torch.Tensor:
    """Inverse of `t_of_tau` (same table): τ for interpolant time t ∈ [0, 1]."""
    t = t if torch.is_tensor(t) else torch.tensor(t, dtype=torch.float64, device="cpu")
    t_grid, tau_grid = _table(vocab_size)
    return _interp(t, t_grid, tau_grid)


def interpolant(noise: torch.Tensor, data: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1−t)·noise + t·data (FLM §3.1). In d-space: (1−t)·z + t·E[y].

    noise, data: [..., D] (same shape); t: broadcastable to noise.shape[:-1] (one time per state row).
    """
    t = t.to(noise.dtype)[..., None]
    return (1.0 - t) * noise + t * data


def flow_map_jump(x_s: torch.Tensor, delta: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """X_{s,t}(x) = ((1−t)/(1−s))·x + ((t−s)/(1−s))·δ_{s,t}(x) (FMLM two-time denoiser, blog §6).

    x_s, delta: [..., D] (delta is a probability vector in V-space, or `probs @ E` in d-space);
    s, t: broadcastable to x_s.shape[:-1], 0 <= s <= t <= 1, s < 1. Identities: X_{t,t} = x, X_{s,1} = δ.
    """
    s, t = s.to(x_s.dtype)[..., None], t.to(x_s.dtype)[..., None]
    one_minus_s = (1.0 - s).clamp_min(1e-12)
    return ((1.0 - t) / one_minus_s) * x_s + ((t - s) / one_minus_s) * delta


def semigroup_weight(s: torch.Tensor, u: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """γ with δ_{s,t}(x) = γ·δ_{s,u}(x) + (1−γ)·δ_{u,t}(X_{s,u}(x)): γ = (1−t)(u−s)/((1−u)(t−s)).

    s <= u <= t in interpolant time (FMLM semigroup, DESIGN.md §4). Zero-length jumps (t = s) give γ = 1 by
    convention; t = 1 gives γ = 0.
    """
    gap = t - s
    gamma = (1.0 - t) * (u - s) / ((1.0 - u).clamp_min(1e-12) * gap.clamp_min(1e-12))
    return torch.where(gap > 0, gamma, torch.ones_like(gamma)).clamp(0.0, 1.0)


def noise_factor(embedding: torch.Tensor) -> torch.Tensor:
    """A square root L (d×d, fp64) of the Gram matrix EᵀE, so z = L·ξ ~ N(0, EᵀE) = law of Eᵀε.

    embedding: [V, d] (any float dtype). Cholesky in fp64; if EᵀE is singular (V < d, tied rows) the
    symmetric square root from an eigendecomposition is used instead (same distribution of z).
    Compute once per embedding and cache it (FlashMapDrafter does); cost O(V·d²).
    """
    e = embedding.detach().to(torch.float64)
    gram = e.T @ e
    chol, info = torch.linalg.cholesky_ex(gram)
    if int(info) == 0:
        return chol
    evals, evecs = torch.linalg.eigh(gram)
    return evecs @ torch.diag(evals.clamp_min(0.0).sqrt()) @ evecs.T


def d_space_noise(factor: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """z = L·ξ per row: xi [..., d] standard normal -> z [..., d] ~ N(0, EᵀE), in xi's dtype."""
    return xi @ factor.to(device=xi.device, dtype=xi.dtype).T

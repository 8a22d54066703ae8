"""Flow math of the FlashMap drafter (DESIGN.md §4): the τ↔t clock, the interpolant, the flow-map jump,
d-space noise (its random stream is rng.drafter_xi).

Conventions: noise at t = 0, data at t = 1 (FLM, Lee et al. 2026, arXiv:2602.16813). `t` is interpolant
time; `τ` ("fraction of initial decoding errors removed") is what the network is conditioned on. Every
formula works in V-space (one-hot states) and in d-space (states seen through the frozen embedding,
`Eᵀx`), because the interpolant and the jump are linear in the state.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Clock:
    """A monotone τ↔t table (DESIGN.md §4): `t_grid`, `tau_grid` [n] fp64 CPU tensors, both strictly
    increasing from (0, 0) to (1, 1). `name`: "full-state" (τ of argmax decoding of the V-dim state, FLM)
    or "projected" (τ of the Bayes reader of the network's d-dim input Eᵀx, `projected_clock_table`)."""
    name: str
    t_grid: torch.Tensor
    tau_grid: torch.Tensor

    def t_of_tau(self, tau: torch.Tensor | float) -> torch.Tensor:
        """t for clock τ, same shape/dtype/device as tau (fp64 for a Python float); τ clamped to [0, 1]."""
        tau = tau if torch.is_tensor(tau) else torch.tensor(tau, dtype=torch.float64, device="cpu")
        return _interp(tau, self.tau_grid, self.t_grid)

    def tau_of_t(self, t: torch.Tensor | float) -> torch.Tensor:
        """Inverse of `t_of_tau`: τ for interpolant time t ∈ [0, 1]."""
        t = t if torch.is_tensor(t) else torch.tensor(t, dtype=torch.float64, device="cpu")
        return _interp(t, self.t_grid, self.tau_grid)


def full_state_clock(vocab_size: int) -> Clock:
    """The FLM clock of a V-dim state (`t_of_tau`), as a Clock."""
    return Clock("full-state", *_table(vocab_size))


def table_clock(t: list[float] | tuple[float, ...], tau: list[float] | tuple[float, ...]) -> Clock:
    """A "projected" Clock from a stored table (`FlashMapConfig.clock_t`, `clock_tau`). ValueError unless
    both have the same length >= 2, are strictly increasing and run from 0 to 1."""
    tt, aa = (torch.tensor(list(x), dtype=torch.float64, device="cpu") for x in (t, tau))
    ok = (tt.numel() == aa.numel() >= 2 and bool((tt.diff() > 0).all()) and bool((aa.diff() > 0).all())
          and float(tt[0]) == float(aa[0]) == 0.0 and float(tt[-1]) == float(aa[-1]) == 1.0)
    if not ok:
        raise ValueError(f"clock_t / clock_tau: expected two strictly increasing tables of equal length >= 2 "
                         f"from 0 to 1, got {len(tt)} / {len(aa)} entries")
    return Clock("projected", tt, aa)


#: SNR grid a = t/(1−t) of the projected table: 0, then 79 geometric points from 0.03 to 3,000
_PROJECTED_SNR = (0.0, *np.geomspace(0.03, 3000.0, 79).tolist())


def whitened_rows(embedding: torch.Tensor) -> torch.Tensor:
    """F = E·L⁻ᵀ [V, d] fp64 with L = `noise_factor(E)`: in these coordinates the network's input is
    u = L⁻¹Eᵀx_t = (1−t)·ξ + t·F[y], ξ ~ N(0, I_d), so the exact reader of u is a nearest-row rule and
    ‖F[v]‖² is row v's share of the signal (Σ_v ‖F[v]‖² = rank E; the full state has 1 per row)."""
    e = embedding.detach().to(torch.float64)
    factor = noise_factor(e)
    return (torch.linalg.pinv(factor) @ e.T).T  # L⁻¹Eᵀ; the pseudo-inverse when EᵀE is singular


def reader_log_likelihood(u: torch.Tensor, rows: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
    """log p(u | y = v) + const for every row v: u [..., d] whitened inputs (`whitened_rows`), rows [V, d],
    t scalar or broadcastable to u.shape[:-1], in [0, 1). Returns [..., V] in u's dtype:
    (t/(1−t)²)·F[v]·u − (t²/(2(1−t)²))·‖F[v]‖² (the Gaussian likelihood of u ~ N(t·F[v], (1−t)²·I))."""
    t = torch.as_tensor(t, dtype=u.dtype, device=u.device)
    t = t[..., None] if t.dim() else t
    rows = rows.to(u.dtype)
    scale = t / (1.0 - t).clamp_min(1e-6) ** 2
    return scale * (u @ rows.T) - 0.5 * scale * t * rows.square().sum(-1)


def reader_accuracy(rows: torch.Tensor, t: torch.Tensor, labels: torch.Tensor, xi: torch.Tensor,
                    chunk: int = 512) -> torch.Tensor:
    """Accuracy of the exact uniform-prior reader at each time of `t` [n_t] (fp64 result [n_t]): labels [n]
    rows drawn as data, xi [n, d] their standard-normal noise (common to every t, so the curve is smooth),
    rows [V, d] = `whitened_rows(E)`. Decodes argmax_v log p(u | v) of u = (1−t)·ξ + t·F[y], in fp32."""
    rows32, out = rows.float(), []
    for t_i in t.tolist():
        if t_i >= 1.0:
            out.append(1.0)
            continue
        a, hits = t_i / (1.0 - t_i), 0
        for i in range(0, labels.numel(), chunk):  # u/(1−t) = ξ + a·F[y]: argmax of a·F[v]·(ξ + a·F[y]) − a²‖F[v]‖²/2
            y = labels[i:i + chunk]
            w = xi[i:i + chunk].float() + a * rows32[y]
            score = a * (w @ rows32.T) - 0.5 * a * a * rows32.square().sum(-1)
            hits += int((score.argmax(-1) == y).sum())
        out.append(hits / labels.numel())
    return torch.tensor(out, dtype=torch.float64)


def projected_clock_table(embedding: torch.Tensor, samples: int = 2048,
                          seed: int = 0) -> tuple[list[float], list[float]]:
    """(t, τ) table of the projected clock: τ(t) = (V·P(t) − 1)/(V − 1), P(t) = Monte-Carlo accuracy of the
    exact uniform-prior reader of the network's input Eᵀx_t (`reader_accuracy`, `samples` draws of (y, ξ)
    from a CPU generator seeded with `seed`, common to every t) on the SNR grid a = t/(1−t) ∈ {0, 0.03 …
    3,000}, plus t = 1. Made monotone as the full-state table (running max, then a 1e-9 ramp), τ(0) = 0 and
    τ(1) = 1 exactly. embedding: [V, d] the flow's state rows (E_s). Cost O(80·samples·V·d) flops (≈ 20 s
    for V = 8,192, d = 896 on one core); build it once and store it (FlashMapDrafter.calibrate_clock)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rows = whitened_rows(embedding)
    g = torch.Generator(device="cpu").manual_seed(seed)
    labels = torch.randint(0, rows.shape[0], (samples,), generator=g)
    xi = torch.randn(samples, rows.shape[1], generator=g, dtype=torch.float64)
    t = torch.tensor([a / (1.0 + a) for a in _PROJECTED_SNR] + [1.0], dtype=torch.float64)
    V = rows.shape[0]
    tau = ((V * reader_accuracy(rows, t, labels, xi) - 1.0) / (V - 1)).clamp(0.0, 1.0)
    tau = torch.cummax(tau, 0).values
    tau[0], tau[-1] = 0.0, 1.0
    tau = (1.0 - _MONOTONE_RAMP) * tau + _MONOTONE_RAMP * t
    return t.tolist(), tau.tolist()


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

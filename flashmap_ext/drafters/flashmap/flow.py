"""Flow math of the FlashMap drafter (DESIGN.md §4): the τ↔t clock, the interpolant, the flow-map jump,
d-space noise and the drafter's own noise stream.

Conventions: noise at t = 0, data at t = 1 (FLM, Lee et al. 2026, arXiv:2602.16813). `t` is interpolant
time; `τ` ("fraction of initial decoding errors removed") is what the network is conditioned on. Every
formula works in V-space (one-hot states) and in d-space (states seen through the frozen embedding,
`Eᵀx`), because the interpolant and the jump are linear in the state.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

#: Philox stream ids used by the verifier (reference.py); the drafter's noise is stream 2.
DRAFTER_STREAM = 2
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

    s <= u <= t in interpolant time (FMLM semigroup, DESIGN §4). Zero-length jumps (t = s) give γ = 1 by
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


# ---------------------------------------------------------------------------------------------------
# The drafter's noise: Philox4x32-10 (the verifier's generator, reference.py / csrc/common/philox.h)
# in plain torch integer ops, so it runs on the tensors' own device, syncs nothing and is captured in
# CUDA graphs; then Box–Muller with log/sin/cos as fp64 polynomials (only +, −, ×, ÷, sqrt, which IEEE
# rounds correctly on every device), so CPU and CUDA give bit-identical fp32 values in eager mode.
# ---------------------------------------------------------------------------------------------------
_M32, _M16 = 0xFFFFFFFF, 0xFFFF
_PHILOX_MUL = (0xD2511F53, 0xCD9E8D57)   # multipliers of counter words 0 and 2
_PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)  # key increments between rounds
_LN2 = math.log(2.0)
_SQRT_HALF = math.sqrt(0.5)
_ATANH_COEFS = [1.0 / (2 * k + 1) for k in range(9)]                           # 2·atanh(s) = 2s·Σ s^2k/(2k+1)
_SIN_COEFS = [(-1) ** k / math.factorial(2 * k + 1) for k in range(10)]        # error ≤ (π/2)^21/21! = 3e-16
_COS_COEFS = [(-1) ** k / math.factorial(2 * k) for k in range(11)]            # error ≤ (π/2)^22/22! = 2e-17


def _pair(a: int, b: int, like: torch.Tensor) -> torch.Tensor:
    """[2] int64 tensor (a, b) on like's device, built by a kernel (a host copy would break graph capture)."""
    return a + (b - a) * torch.arange(2, dtype=torch.int64, device=like.device)


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 blocks (Salmon et al. 2011) in torch int64 ops; twin of reference.philox4x32_10.

    counter: [..., 4], key: [..., 2] int64 holding uint32 words (broadcastable leading dims).
    Returns the [..., 4] output words. Products stay below 2^49 (32 × 16-bit halves), so no int64 op
    ever overflows. Words 0, 2 ("even") are multiplied, words 1, 3 ("odd") only xor-ed.
    """
    even, odd = counter[..., 0::2], counter[..., 1::2]
    mul_lo = _pair(_PHILOX_MUL[0] & _M16, _PHILOX_MUL[1] & _M16, counter)
    mul_hi = _pair(_PHILOX_MUL[0] >> 16, _PHILOX_MUL[1] >> 16, counter)
    weyl = _pair(*_PHILOX_WEYL, counter)
    for r in range(10):
        if r:
            key = (key + weyl) & _M32
        low = even * mul_lo                       # even·M = low + 2^16·even·mul_hi
        t = (low >> 16) + even * mul_hi
        hi, lo = t >> 16, ((t & _M16) << 16) | (low & _M16)
        # (c0, c1, c2, c3) <- (hi(c2)^c1^k0, lo(c2), hi(c0)^c3^k1, lo(c0))
        even, odd = hi.flip(-1) ^ odd ^ key, lo.flip(-1)
    return torch.stack((even, odd), dim=-1).flatten(-2)


def _log_unit(u: torch.Tensor) -> torch.Tensor:
    """log(u) for fp64 u in (0, 1]: u = m·2^e, m in [√½, √2), log m = 2·atanh((m−1)/(m+1)) as a series
    (|s| ≤ 0.172: 9 terms leave < 1e-16)."""
    m, e = torch.frexp(u)
    low = m < _SQRT_HALF
    m, e = torch.where(low, m * 2.0, m), e - low.to(e.dtype)
    s = (m - 1.0) / (m + 1.0)
    s2, poly = s * s, torch.full_like(s, _ATANH_COEFS[-1])
    for c in reversed(_ATANH_COEFS[:-1]):
        poly = poly * s2 + c
    return e.to(torch.float64) * _LN2 + 2.0 * s * poly


def _cos_sin_turn(word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos θ, sin θ (fp64) of θ = 2π·(word + ½)/2^32: the quadrant from the top 2 bits (exact), Taylor
    series of the angle φ in (0, π/2) within it."""
    quadrant = word >> 30
    phi = ((word & (2**30 - 1)).to(torch.float64) + 0.5) * (math.pi / 2**31)
    x2 = phi * phi
    sin, cos = torch.full_like(phi, _SIN_COEFS[-1]), torch.full_like(phi, _COS_COEFS[-1])
    for c in reversed(_SIN_COEFS[:-1]):
        sin = sin * x2 + c
    for c in reversed(_COS_COEFS[:-1]):
        cos = cos * x2 + c
    sin = sin * phi
    odd = (quadrant & 1) == 1  # θ = q·π/2 + φ: quadrants 1, 3 swap cos and sin
    c, s = torch.where(odd, sin, cos), torch.where(odd, cos, sin)
    c = torch.where(((quadrant + 1) & 2) == 2, -c, c)  # cos θ < 0 in quadrants 1, 2
    s = torch.where(quadrant >= 2, -s, s)             # sin θ < 0 in quadrants 2, 3
    return c, s


def drafter_counter(seed: torch.Tensor, position: torch.Tensor, num_slots: int, dim: int,
                    stream: int = DRAFTER_STREAM) -> tuple[torch.Tensor, torch.Tensor]:
    """Philox (counter [B, K, ⌈d/4⌉, 4], key [B, 1, 1, 2]) of the drafter's noise: key = seed,
    counter = (position lo, position hi, stream, (slot + 1)·2^16 + ⌊dim/4⌋). Word 3 is never 0, so no
    drafter block is ever one of the verifier's coins (reference.verify_uniform: word 3 = 0)."""
    if not (0 < num_slots < _M16 and 0 < dim <= 4 * 2**16):
        raise ValueError(f"shape: need 1 <= slots < 65535 and 1 <= dim <= 262144, got ({num_slots}, {dim})")
    seed, position = (x.to(torch.int64).reshape(-1, 1, 1) for x in (seed, position))
    quads = torch.arange((dim + 3) // 4, dtype=torch.int64, device=seed.device)
    slots = torch.arange(1, num_slots + 1, dtype=torch.int64, device=seed.device)
    block = slots[:, None] * 2**16 + quads  # [K, Q]
    words = (position & _M32, (position >> 32) & _M32, torch.full_like(position, stream), block)
    counter = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    key = torch.stack((seed & _M32, (seed >> 32) & _M32), dim=-1)
    return counter, key


def drafter_xi(seed: torch.Tensor, position: torch.Tensor, shape: tuple[int, int],
               stream: int = DRAFTER_STREAM) -> torch.Tensor:
    """Standard-normal ξ [B, K, d] fp32 on seed's device: ξ[b, k, i] depends only on (seed[b],
    position[b], slot k, dim i, stream) — never on the batch row, batch-mates, K or d.

    seed, position: [B] int64 on one device (the anchor's absolute position). Philox block
    `drafter_counter` gives words w0..w3 for dims 4j..4j+3; Box–Muller on u = (w + ½)/2^32:
    ξ[4j], ξ[4j+1] = r(w0)·(cos, sin) θ(w1) and ξ[4j+2], ξ[4j+3] = r(w2)·(cos, sin) θ(w3), with
    r(w) = sqrt(−2 log u(w)), θ(w) = 2π·u(w); computed in fp64, rounded once to fp32 (|ξ| < 6.8).
    No host sync, no data-dependent shape: CUDA-graph capturable. Bit-identical on CPU and CUDA in
    eager mode (integer ops are exact; the float ops are IEEE-rounded +, −, ×, ÷, sqrt and exact frexp);
    a compiler that fuses multiply-adds may change the last fp64 bit.
    """
    num_slots, dim = shape
    counter, key = drafter_counter(seed, position, num_slots, dim, stream)
    words = philox4x32_10(counter, key)
    radius = torch.sqrt(-2.0 * _log_unit((words[..., 0::2].to(torch.float64) + 0.5) * 2.0**-32))
    cos, sin = _cos_sin_turn(words[..., 1::2])
    xi = torch.stack((radius * cos, radius * sin), dim=-1)  # [B, K, Q, 2, 2]
    return xi.reshape(*counter.shape[:2], -1)[..., :dim].to(torch.float32)

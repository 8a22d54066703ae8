"""Counter-based randomness, the Python twin of csrc/common/philox.h (DESIGN.md §3.1).

Philox4x32-10 (Salmon et al. 2011, Random123) keyed by the request seed, counted by (position, stream):
a row's coins never depend on its batch-mates, and the streams never share a block.
- `philox4x32_10_words`: one block on Python ints (the float64 references call it per coin);
  `philox4x32_10`: the same function on int64 tensors (on device, graph-capturable).
- `verify_uniform`: the verifier's coin; `drafter_xi`: the FlashMap drafter's Gaussian noise.
"""
from __future__ import annotations

import math

import torch

#: Philox streams (counter word 2): the verifier's accept and resample coins, the drafter's noise.
STREAM_ACCEPT, STREAM_RESAMPLE, STREAM_DRAFTER = 0, 1, 2
DRAFTER_STREAM = STREAM_DRAFTER

_M32, _M16 = 0xFFFFFFFF, 0xFFFF
_PHILOX_MUL = (0xD2511F53, 0xCD9E8D57)   # multipliers of counter words 0 and 2
_PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)  # key increments between rounds


def philox4x32_10_words(counter: tuple, key: tuple) -> tuple:
    """Philox4x32-10 block (Salmon et al. 2011, Random123): 4 counter words, 2 key words -> 4 words."""
    c0, c1, c2, c3 = (w & _M32 for w in counter)
    k0, k1 = (w & _M32 for w in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + _PHILOX_WEYL[0]) & _M32, (k1 + _PHILOX_WEYL[1]) & _M32
        p0, p1 = _PHILOX_MUL[0] * c0, _PHILOX_MUL[1] * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
    return c0, c1, c2, c3


def verify_uniform(seed: int, position: int, stream: int) -> float:
    """The verifier's coin: key = seed, counter = (position, stream); 24-bit uniform in [0, 1)."""
    seed, position = seed & (2**64 - 1), position & (2**64 - 1)
    word = philox4x32_10_words((position, position >> 32, stream, 0), (seed, seed >> 32))[0]
    return (word >> 8) * 2.0**-24


# ---------------------------------------------------------------------------------------------------
# The drafter's noise: Philox4x32-10 (philox4x32_10_words / csrc/common/philox.h)
# in plain torch integer ops, so it runs on the tensors' own device, syncs nothing and is captured in
# CUDA graphs; then Box–Muller with log/sin/cos as fp64 polynomials (only +, −, ×, ÷, sqrt, which IEEE
# rounds correctly on every device), so CPU and CUDA give bit-identical fp32 values in eager mode.
# ---------------------------------------------------------------------------------------------------
_LN2 = math.log(2.0)
_SQRT_HALF = math.sqrt(0.5)
_ATANH_COEFS = [1.0 / (2 * k + 1) for k in range(9)]                           # 2·atanh(s) = 2s·Σ s^2k/(2k+1)
_SIN_COEFS = [(-1) ** k / math.factorial(2 * k + 1) for k in range(10)]        # error ≤ (π/2)^21/21! = 3e-16
_COS_COEFS = [(-1) ** k / math.factorial(2 * k) for k in range(11)]            # error ≤ (π/2)^22/22! = 2e-17


def _pair(a: int, b: int, like: torch.Tensor) -> torch.Tensor:
    """[2] int64 tensor (a, b) on like's device, built by a kernel (a host copy would break graph capture)."""
    return a + (b - a) * torch.arange(2, dtype=torch.int64, device=like.device)


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 blocks (Salmon et al. 2011) in torch int64 ops; twin of philox4x32_10_words.

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
    drafter block is ever one of the verifier's coins (verify_uniform: word 3 = 0)."""
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

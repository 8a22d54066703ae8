// Shared __host__ __device__ core of the verify kernels (CPU: verify_cpu.cpp, CUDA: verify_kernel.cu):
// the per-element and per-slot rules, so both backends decide identically given the same statistics.
// Reference: flashmap_ext/ops/verify_reference.py::verify_reference. Rejection rule after Leviathan et al. 2023
// (arXiv:2211.17192) and Chen et al. 2023 (arXiv:2302.01318).
#pragma once

#include <cstdint>
#include <cstring>

#include "verify/verify_params.h"
#include "common/macros.h"
#include "common/philox.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace flashmap {

// --- logit loads -----------------------------------------------------------------------------------
FM_HOST_DEVICE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

FM_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float (exact), bit-level so that the host needs no half type.
FM_HOST_DEVICE float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    exp = 1;  // subnormal: normalise
    while (!(man & 0x400u)) { man <<= 1; --exp; }
    man &= 0x3FFu;
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

template <LogitDType D> struct LogitLoad;
template <> struct LogitLoad<LogitDType::kF32> {
  using T = float;
  static FM_HOST_DEVICE float load(const T* p, int64_t j) { return p[j]; }
};
template <> struct LogitLoad<LogitDType::kF16> {
  using T = uint16_t;
  static FM_HOST_DEVICE float load(const T* p, int64_t j) {
#if defined(__CUDA_ARCH__)
    return __half2float(reinterpret_cast<const __half*>(p)[j]);
#else
    return fp16_to_float(p[j]);
#endif
  }
};
template <> struct LogitLoad<LogitDType::kBF16> {
  using T = uint16_t;
  static FM_HOST_DEVICE float load(const T* p, int64_t j) { return bf16_to_float(p[j]); }
};

// --- order keys: a monotone map float -> uint32 (radix selection of top-k / top-p thresholds) ------
FM_HOST_DEVICE uint32_t float_key(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One step of an MSB-first radix selection of the threshold key k* = the largest key with
// W(key >= k*) >= target (W = counts for top-k, probability mass for top-p; keep = key >= k*).
// hist[256] holds W per digit among keys matching the digits chosen so far; `above` is W of keys
// already known to lie above. Returns the digit, or -1 when even all of them do not reach target.
template <typename W>
FM_HOST_DEVICE int radix_pick_digit(const W* hist, W target, W& above) {
  for (int d = 255; d >= 0; --d) {
    if (above + hist[d] >= target && hist[d] > W(0)) return d;
    above += hist[d];
  }
  return -1;
}

// --- sampling parameters of row b: its [B] entry, or the value shared by every row ----------------------
FM_HOST_DEVICE float verify_temperature(const VerifyParams& p, int64_t b) {
  return p.temperature ? p.temperature[b] : p.temperature_value;
}
FM_HOST_DEVICE int32_t verify_top_k(const VerifyParams& p, int64_t b) { return p.top_k ? p.top_k[b] : p.top_k_value; }
FM_HOST_DEVICE float verify_top_p(const VerifyParams& p, int64_t b) { return p.top_p ? p.top_p[b] : p.top_p_value; }
FM_HOST_DEVICE int64_t verify_seed(const VerifyParams& p, int64_t b) { return p.seed ? p.seed[b] : p.seed_value; }
FM_HOST_DEVICE int64_t verify_position(const VerifyParams& p, int64_t b) {
  return p.position ? p.position[b] : p.position_value;
}

// --- per-slot rules ---------------------------------------------------------------------------------
// A draft id outside [0, valid_vocab) (-1 = none) rejects its slot and every later one.
FM_HOST_DEVICE int64_t verify_draft(const VerifyParams& p, int64_t b, int64_t i) {
  if (i >= p.K) return -1;
  const int64_t x = p.draft_tokens[b * p.K + i];
  return (x >= 0 && x < p.valid_vocab) ? x : -1;
}

// Coin for slot i: injected uniforms[b, i] (accept) / uniforms[b, K] (resample), else Philox keyed
// by (seed, position + i, stream) — never by the batch row.
FM_HOST_DEVICE double verify_coin(const VerifyParams& p, int64_t b, int64_t i, uint32_t stream) {
  if (p.uniforms) return p.uniforms[b * (p.K + 1) + (stream == kStreamAccept ? i : p.K)];
  return philox_coin(verify_seed(p, b), verify_position(p, b) + i, stream);
}

FM_HOST_DEVICE bool verify_is_greedy(const VerifyParams& p, int64_t b) { return !(verify_temperature(p, b) > 0.f); }
FM_HOST_DEVICE bool verify_topk_on(const VerifyParams& p, int64_t b) {
  return verify_top_k(p, b) > 0 && verify_top_k(p, b) < p.valid_vocab;
}
FM_HOST_DEVICE bool verify_topp_on(const VerifyParams& p, int64_t b) { return verify_top_p(p, b) < 1.f; }

// Draft distribution q of slot i (nullptr: point-mass draft, or the bonus slot K).
FM_HOST_DEVICE const float* verify_draft_q(const VerifyParams& p, int64_t b, int64_t i) {
  return (p.draft_probs && i < p.K) ? p.draft_probs + b * p.draft_probs_stride_b + i * p.draft_probs_stride_k
                                    : nullptr;
}

// Error bits of slot i that do not come from its logits: the row's sampling parameters outside their
// domain (the wrapper checks python scalars and CPU tensors on the host; CUDA tensors only here, so it
// never syncs), and a draft_probs entry q(x) at the drafted id of a sampling slot outside (0, 1] — x was
// sampled from q, so q(x) > 0; NaN, ±inf, 0, negatives and > 1 all fail. Only q(x), which the accept test
// reads anyway, is checked: validating every q(j) would cost a pass over V per slot, and no check can
// prove x was sampled from q. Greedy rows never read draft_probs, so they are not checked.
FM_HOST_DEVICE int32_t verify_input_status(const VerifyParams& p, int64_t b, int64_t i) {
  const float t = verify_temperature(p, b), tp = verify_top_p(p, b);
  // temperature in [0, FLT_MAX]: NaN, negatives and +inf fail (as the scalar checks)
  int32_t status = (t >= 0.f && t <= 3.40282347e38f && tp >= 0.f && tp <= 1.f && verify_top_k(p, b) >= 0) ? 0 : kStatusBadParams;
  const float* q = verify_draft_q(p, b, i);
  const int64_t x = verify_draft(p, b, i);
  if (q && x >= 0 && !verify_is_greedy(p, b) && !(q[x] > 0.f && q[x] <= 1.f)) status |= kStatusBadDraftProb;
  return status;
}

// 1 / T, finite even for denormal T (then only the max-logit ids keep mass).
FM_HOST_DEVICE float verify_inv_temperature(float t) {
  const float inv = 1.f / t;
  return inv < 3.0e38f ? inv : 3.0e38f;
}

// Accept iff u·q(x) < p(x) with p(x) = e_x / S (q(x) = 1 for point-mass drafts). u < 1, so p(x) = 0
// is never accepted and q = p always is.
FM_HOST_DEVICE bool verify_accept(double u, double qx, double ex, double S) { return u * qx * S < ex; }

// Residual weight of id j at a rejected slot, unnormalised: point-mass (q == nullptr) → p minus x;
// no draft (x < 0) → p; else max(p − q, 0) (in units of probability times S).
FM_HOST_DEVICE double verify_residual(double ej, double S, const float* q, int64_t j, int64_t x) {
  if (x < 0) return ej;
  if (!q) return j == x ? 0.0 : ej;
  const double r = ej - static_cast<double>(q[j]) * S;
  return r > 0.0 ? r : 0.0;
}

// Writes row b's outputs: drafts 0..j-1, `emitted` at slot j, -1 after. Error rows get token 0 at
// slot 0 and only their error bits.
FM_HOST_DEVICE void verify_write_row(const VerifyParams& p, int64_t b, int64_t j, int64_t emitted,
                                     int32_t status) {
  int64_t* out = p.tokens + b * (p.K + 1);
  if (status & kStatusErrors) {
    j = 0;
    emitted = 0;
    status &= kStatusErrors;
  }
  for (int64_t i = 0; i <= p.K; ++i) out[i] = i < j ? p.draft_tokens[b * p.K + i] : (i == j ? emitted : -1);
  p.num_accepted[b] = static_cast<int32_t>(j);
  p.status[b] = status;
}

}  // namespace flashmap

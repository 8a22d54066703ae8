// Vocabulary loops of the CPU verify kernel (verify_cpu.cpp): one slot's logits row, one thread.
// The hot loops are branch-free so they vectorise, and on x86-64 GCC builds them for AVX-512, AVX2 and
// the baseline ISA, picked at load time (target_clones); reductions therefore keep one fixed order per
// machine. Rules shared with the CUDA kernel live in verify_core.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "verify/verify_core.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FM_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FM_CPU_CLONES
#endif

namespace flashmap {
namespace cpu {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kSortedThreshold = 1024;  // below this many ids a sort beats 4 radix passes

template <LogitDType D>
using Ptr = const typename LogitLoad<D>::T*;

// exp(x) for x <= 0 (Cephes expf polynomial, ~2 ulp), 0 below −87.3. Round-to-nearest by the 1.5·2^23
// trick instead of floor, so the loop needs no SSE4.1 and vectorises everywhere.
inline float exp_nonpos(float x) {
  const float xc = x < -87.3f ? -87.3f : x;
  const float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const float scale = bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x < -87.3f ? 0.0f : y * scale;
}

struct SlotScan {
  float max = -kInf;
  int32_t status = 0;
};

// Max logit over ids [0, vv) (NaN ignored) and the slot's status bits (NaN/+inf; no finite logit).
template <LogitDType D>
FM_CPU_CLONES SlotScan scan_slot(Ptr<D> l, int64_t vv) {
  float m = -kInf;
  int nonfinite = 0, finite = 0;
#pragma omp simd reduction(max : m) reduction(| : nonfinite, finite)
  for (int64_t j = 0; j < vv; ++j) {
    const float v = LogitLoad<D>::load(l, j);
    m = v > m ? v : m;
    nonfinite |= (v != v) | (v == kInf);
    finite |= std::fabs(v) < kInf;
  }
  return SlotScan{m, (nonfinite ? kStatusNonFinite : 0) | (finite ? 0 : kStatusNoFinite)};
}

// Lowest id whose logit equals the max (torch.argmax's tie rule).
template <LogitDType D>
int64_t first_argmax(Ptr<D> l, int64_t vv, float m) {
  for (int64_t j = 0; j < vv; ++j)
    if (LogitLoad<D>::load(l, j) == m) return j;
  return 0;
}

// e_j = exp((l_j − m)·inv_t) for ids with order key >= kmin, else 0, into e[0, vv); returns Σ e.
template <LogitDType D>
FM_CPU_CLONES double fill_exp(Ptr<D> l, int64_t vv, float m, float inv_t, uint32_t kmin, float* e) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < vv; ++j) {
    const float v = LogitLoad<D>::load(l, j);
    const float ej = float_key(v) >= kmin ? exp_nonpos((v - m) * inv_t) : 0.f;
    e[j] = ej;
    sum += ej;
  }
  return sum;
}

// Threshold key for small vocabularies: sort (key, weight) by key, walk tie groups downwards.
template <LogitDType D, typename Wf>
uint32_t sorted_threshold(Ptr<D> l, int64_t vv, double target, const Wf& w) {
  thread_local std::vector<std::pair<uint32_t, double>> kw;
  kw.clear();
  for (int64_t j = 0; j < vv; ++j) kw.emplace_back(float_key(LogitLoad<D>::load(l, j)), w(j));
  std::sort(kw.begin(), kw.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double above = 0.0;
  for (size_t i = 0; i < kw.size();) {
    size_t e = i;
    double group = 0.0;
    for (; e < kw.size() && kw[e].first == kw[i].first; ++e) group += kw[e].second;
    if (group > 0.0 && above + group >= target) return kw[i].first;
    above += group;
    i = e;
  }
  return 0u;
}

// Largest order key k* with W(key >= k*) >= target over ids [0, vv), W summing w(j) (counts for
// top-k, mass for top-p); keep = key >= k*. Radix selection, 4 passes of 8-bit digits (MSB first).
// Returns 0 (keep all) when the total misses the target.
template <LogitDType D, typename Wf>
uint32_t threshold_key(Ptr<D> l, int64_t vv, double target, const Wf& w) {
  if (vv <= kSortedThreshold) return sorted_threshold<D>(l, vv, target, w);
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    double hist[256] = {};
    for (int64_t j = 0; j < vv; ++j) {
      const uint32_t key = float_key(LogitLoad<D>::load(l, j));
      if ((key & mask) == prefix) hist[(key >> shift) & 255u] += w(j);
    }
    const int digit = radix_pick_digit<double>(hist, target, above);
    if (digit < 0) return 0u;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// Σ of residual weights (verify_core.h::verify_residual) over ids [0, vv).
inline double residual_total(const float* e, double S, const float* q, int64_t x, int64_t vv) {
  double R = 0.0;
  for (int64_t j = 0; j < vv; ++j) R += verify_residual(e[j], S, q, j, x);
  return R;
}

// Inverse CDF: smallest id whose cumulative residual weight exceeds target; the last positive id when
// rounding runs past the end; 0 when there is none.
inline int64_t residual_pick(const float* e, double S, const float* q, int64_t x, int64_t vv, double target) {
  double cum = 0.0;
  int64_t last = 0;
  for (int64_t j = 0; j < vv; ++j) {
    const double r = verify_residual(e[j], S, q, j, x);
    if (r <= 0.0) continue;
    cum += r;
    last = j;
    if (cum > target) return j;
  }
  return last;
}

}  // namespace cpu
}  // namespace flashmap

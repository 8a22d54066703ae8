// The slice decomposition of the v2 verify kernels (CUDA: verify_v2_kernel.cu; CPU twin:
// verify_cpu_sliced.h), shared so that both reduce a logits row in the same order. Pure host/device code,
// no CUDA headers: the plan is compiled and checked on a CPU machine (python_tests/verify/test_verify_v2.py).
//
// A row's valid ids are cut into chunks of kVerifyChunk ids and the chunks into kVerifySlices contiguous
// slices. Lane t (of kVerifyLanes) of a slice takes the slice's chunks t, t + kVerifyLanes, ... in that
// order and keeps an online (max, Σ 2^((v − max)·c)) with c = log2(e) / T, rescaled only when a chunk's
// max rises above its own; the lanes are reduced in a fixed tree (verify_tree_reduce) into one record per
// slice, and the slices are merged in slice order. The tree does not depend on how many CTAs share a
// row (a cluster of 1, 2, 4 or 8): the CTA count only decides who computes which slice, so results are
// bitwise the same for every batch size and cluster size.
#pragma once

#include <cstdint>

#include "common/macros.h"

namespace flashmap {

constexpr int kVerifySlices = 8;    // slices per row: the merge order, and the largest cluster
constexpr int kVerifyChunk = 8;     // ids per chunk: one 16-byte bf16/fp16 vector, two fp32 ones
constexpr int kVerifyLanes = 256;   // lanes per slice: the threads of one v2 CTA
constexpr int kVerifyWarpCount = kVerifyLanes / 32;
constexpr int32_t kVerifyNoId = 0x7FFFFFFF;             // "no id yet" in an argmax record (loses every tie)
constexpr float kVerifyInf = __builtin_huge_valf();
constexpr float kVerifyLog2e = 1.4426950408889634f;
constexpr float kVerifyMaxScale = 3.0e38f;              // bound of c, as verify_inv_temperature's

// --- the plan (host and device) ---------------------------------------------------------------------
FM_HOST_DEVICE int64_t verify_chunk_count(int64_t vv) { return (vv + kVerifyChunk - 1) / kVerifyChunk; }
FM_HOST_DEVICE int64_t verify_slice_chunks(int64_t vv) {
  return (verify_chunk_count(vv) + kVerifySlices - 1) / kVerifySlices;
}
// Chunks [begin, end) of slice s (empty slices at the end of a small row).
struct SliceRange {
  int64_t begin, end;
};
FM_HOST_DEVICE SliceRange verify_slice_range(int64_t vv, int s) {
  const int64_t n = verify_chunk_count(vv), per = verify_slice_chunks(vv);
  const int64_t b = s * per < n ? s * per : n, e = (s + 1) * per < n ? (s + 1) * per : n;
  return {b, e};
}
// Emission scan: lane t owns the contiguous chunks [begin + t·span, begin + (t + 1)·span) of a slice.
FM_HOST_DEVICE int64_t verify_lane_span(int64_t vv) {
  return (verify_slice_chunks(vv) + kVerifyLanes - 1) / kVerifyLanes;
}

// CTAs per row (the cluster size): the largest of 8, 4, 2 whose clusters all fit on the GPU at once —
// resident[k] clusters of 2^k CTAs (k = 1, 2, 3; from cudaOccupancyMaxActiveClusters) — else 1. A small batch
// spreads every row over 8 SMs; a batch that fills the GPU gets one CTA per row.
inline int verify_cluster_size(int64_t rows, const int64_t (&resident)[4]) {
  for (int k = 3; k > 0; --k)
    if (rows <= resident[k]) return 1 << k;
  return 1;
}

// Shared-memory bytes that keep a CTA's slice resident for the filter passes (top-k / top-p): only with
// one slice per CTA (a cluster of 8, so the batch is small and the SMs have room) and within
// kVerifyResidentBudget; else 0 and the passes re-read the logits from global memory (L2).
constexpr int64_t kVerifyResidentBudget = 96 * 1024;
inline int64_t verify_resident_bytes(int64_t vv, int cluster, int elem_bytes) {
  const int64_t bytes = verify_slice_chunks(vv) * kVerifyChunk * elem_bytes;
  return cluster == kVerifySlices && bytes <= kVerifyResidentBudget ? bytes : 0;
}

// --- arithmetic shared by the CPU twin and the CUDA kernel ----------------------------------------------
// max with NaN propagation (PTX max.NaN): one accumulator tells NaN / +inf / "nothing finite" apart.
FM_HOST_DEVICE float verify_max_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a ? a : (b != b ? b : (a > b ? a : b));
#endif
}

// Unrounded-product-free multiply and add (no FMA contraction), so the CPU twin and the kernel round alike.
FM_HOST_DEVICE float verify_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}
FM_HOST_DEVICE float verify_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}

// c = log2(e) / T, bounded (a denormal T keeps only the max-logit ids, as in verify_inv_temperature).
FM_HOST_DEVICE float verify_exp2_scale(float temperature) {
  const float c = kVerifyLog2e / temperature;
  return c < kVerifyMaxScale ? c : kVerifyMaxScale;
}

// Σ of a chunk's 8 terms in a fixed pairwise order.
FM_HOST_DEVICE float verify_chunk_sum(const float (&t)[kVerifyChunk]) {
  return verify_add(verify_add(verify_add(t[0], t[1]), verify_add(t[2], t[3])),
                    verify_add(verify_add(t[4], t[5]), verify_add(t[6], t[7])));
}

// Per-lane online state of a slice pass. m: the max raw logit so far (NaN-propagating), mf: m while it is
// finite (0 before the first finite value, so that −inf logits weigh 0), s: Σ 2^((v − mf)·c) of the ids
// seen, chunk: the first chunk (in this lane's order) whose max equals m (-1: none), for the lazy argmax.
struct LaneStat {
  float m = -kVerifyInf, mf = 0.f, s = 0.f;
  int32_t chunk = -1;
};

// A chunk whose max cm is not below m: rescale s to the new max (the rare path of the hot loop).
template <typename Exp2>
FM_HOST_DEVICE void verify_lane_raise(LaneStat& st, float cm, int32_t chunk, float c, const Exp2& ex2) {
  const float mn = verify_max_nan(st.m, cm);
  st.s = st.m > -kVerifyInf ? verify_mul(st.s, ex2(verify_mul(st.m - mn, c))) : 0.f;
  st.m = mn;
  st.mf = mn;
  st.chunk = chunk;
}

// One chunk of a lane: v its 8 values (−inf past the row), cm their NaN-propagating max. kSum: add the
// chunk's terms (sampling rows), else only the max (greedy rows and the first pass of a filtered row).
// `raise(st, cm, chunk)` runs verify_lane_raise (the CUDA kernel keeps it out of line: the rare path).
template <bool kSum, typename Exp2, typename Raise>
FM_HOST_DEVICE void verify_lane_push(LaneStat& st, const float (&v)[kVerifyChunk], float cm, int32_t chunk,
                                     float c, const Exp2& ex2, const Raise& raise) {
  if (!(cm <= st.m)) raise(st, cm, chunk);
  if constexpr (kSum) {
    float t[kVerifyChunk];
    for (int k = 0; k < kVerifyChunk; ++k) t[k] = ex2(verify_mul(v[k] - st.mf, c));
    st.s = verify_add(st.s, verify_chunk_sum(t));
  }
}

// A slice's (or a row's) statistics: max (NaN-propagating), Σ 2^((v − m)·c), lowest id holding m.
struct SliceStat {
  float m = -kVerifyInf, s = 0.f;
  int32_t arg = kVerifyNoId;
};

// a ⊕ b, a the lower lane / earlier slice: the fixed-order merge of the tree and of the slices.
template <typename Exp2>
FM_HOST_DEVICE SliceStat verify_combine(const SliceStat& a, const SliceStat& b, float c, const Exp2& ex2) {
  SliceStat r;
  r.m = verify_max_nan(a.m, b.m);
  const float fa = a.m > -kVerifyInf ? ex2(verify_mul(a.m - r.m, c)) : 0.f;
  const float fb = b.m > -kVerifyInf ? ex2(verify_mul(b.m - r.m, c)) : 0.f;
  r.s = verify_add(verify_mul(a.s, fa), verify_mul(b.s, fb));
  r.arg = b.m > a.m ? b.arg : (a.m > b.m ? a.arg : (a.arg < b.arg ? a.arg : b.arg));
  return r;
}

// Σ of a slice's s rescaled to the row max M (0 for a slice without a finite value).
template <typename Exp2>
FM_HOST_DEVICE float verify_rescaled(const SliceStat& st, float M, float c, const Exp2& ex2) {
  return st.m > -kVerifyInf ? verify_mul(st.s, ex2(verify_mul(st.m - M, c))) : 0.f;
}

// The reduction tree over the kVerifyLanes lanes: within each warp of 32 lanes, pairs (l, l + o) for
// o = 16, 8, 4, 2, 1 (the lower lane first); then the warps' results the same way for o = 4, 2, 1. The CUDA
// kernel runs it as xor shuffles, every lane combining (lower, higher): all lanes agree on the result.
// `a` is overwritten; returns a[0].
template <typename T, typename Comb>
FM_HOST_DEVICE T verify_tree_reduce(T* a, const Comb& comb) {
  for (int w = 0; w < kVerifyWarpCount; ++w)
    for (int o = 16; o; o >>= 1)
      for (int l = 0; l < o; ++l) a[32 * w + l] = comb(a[32 * w + l], a[32 * w + l + o]);
  for (int o = kVerifyWarpCount / 2; o; o >>= 1)
    for (int w = 0; w < o; ++w) a[32 * w] = comb(a[32 * w], a[32 * (w + o)]);
  return a[0];
}

// Inclusive scan over the kVerifyLanes lane values in the kernel's order: Kogge-Stone within each warp
// (v[l] += v[l − o] for o = 1, 2, 4, 8, 16), then the same over the warp totals, whose exclusive prefix is
// added to each lane. In place.
FM_HOST_DEVICE void verify_lane_scan(float* v) {
  float total[kVerifyWarpCount];
  for (int w = 0; w < kVerifyWarpCount; ++w) {
    float* x = v + 32 * w;
    for (int o = 1; o < 32; o <<= 1)
      for (int l = 31; l >= o; --l) x[l] = verify_add(x[l], x[l - o]);
    total[w] = x[31];
  }
  for (int o = 1; o < kVerifyWarpCount; o <<= 1)
    for (int w = kVerifyWarpCount - 1; w >= o; --w) total[w] = verify_add(total[w], total[w - o]);
  for (int w = 1; w < kVerifyWarpCount; ++w)
    for (int l = 0; l < 32; ++l) v[32 * w + l] = verify_add(v[32 * w + l], total[w - 1]);
}

}  // namespace flashmap

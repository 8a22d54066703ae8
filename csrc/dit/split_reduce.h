// The reduction orders of the split kernels, as plain functions of indices and loaders: compiled into the
// kernels (linear_kernel.cuh, attention_kernel.cuh) and, with the system C++ compiler, into the CPU
// emulation that checks them against float64 (python_tests/ops/test_split_reduce.py). No CUDA headers.
//
// Split-K (linear): the fp32 partial tiles of S splits are summed per element in split order,
// s = ((0 + p_0) + p_1) + ... + p_{S-1}, whichever CTA does it: the last CTA to arrive (the default) or, in
// a thread-block cluster (FLASHMAP_DIT_CLUSTER_SPLITK=1), rank r of S for the elements of its slice.
// Flash-decoding merge (attention): out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max_s lse_s), both
// sums in split order; splits past the active count (from the row's key count) hold no key and are skipped.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHMAP_HD __host__ __device__ __forceinline__
#else
#define FLASHMAP_HD inline
using std::exp2f;
using std::fmaxf;
#endif

namespace flashmap::dit {

// Largest cluster the split-K plan uses (the portable cluster size of Hopper).
constexpr int kMaxClusterSplits = 8;

struct Slice {
  int begin, end;  // [begin, end)
};

// Rank `rank` of `ranks`' share of `elems` elements: contiguous, in rank order, sizes differing by <= 1.
FLASHMAP_HD Slice rank_slice(int rank, int ranks, int elems) {
  return {static_cast<int>(int64_t(rank) * elems / ranks), static_cast<int>(int64_t(rank + 1) * elems / ranks)};
}

// sum_{sp < splits} load(sp), accumulated in split order from +0 (the split-K fixup of one element).
template <class Load>
FLASHMAP_HD float sum_in_split_order(const Load& load, int splits) {
  float s = 0.f;
  for (int sp = 0; sp < splits; ++sp) s += load(sp);
  return s;
}

// The same sum with every load of up to kMax splits issued before the first add (independent loads in
// flight together; the adds stay in split order, so the result is bitwise that of sum_in_split_order).
template <int kMax, class Load>
FLASHMAP_HD float sum_in_split_order_batched(const Load& load, int splits) {
  float v[kMax];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int sp = 0; sp < kMax; ++sp) v[sp] = sp < splits ? load(sp) : 0.f;
  float s = 0.f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int sp = 0; sp < kMax; ++sp)
    if (sp < splits) s += v[sp];
  return s;
}

// The merge weights of one query row: w[s] = 2^(lse(s) - max) for s < splits, returned sum_s w[s] in split
// order; all w 0 (and 0 returned) when no split saw a key (every lse -inf). w may be lse's own storage:
// lse(s) is read for the last time just before w[s] is written.
template <class Lse>
FLASHMAP_HD float merge_weights(const Lse& lse, int splits, float* w) {
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse(s));
  float wsum = 0.f;
  for (int s = 0; s < splits; ++s) {
    w[s] = mx == -INFINITY ? 0.f : exp2f(lse(s) - mx);
    wsum += w[s];
  }
  return wsum;
}

// sum_s w(s) * load(s) in split order, the loads issued kChunk at a time (the merged output of one element,
// before the division by the weights' sum).
template <int kChunk, class Weight, class Load>
FLASHMAP_HD float weighted_sum_in_split_order(const Weight& w, const Load& load, int splits) {
  float o = 0.f;
  for (int s0 = 0; s0 < splits; s0 += kChunk) {
    float v[kChunk];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kChunk; ++j) v[j] = s0 + j < splits ? load(s0 + j) : 0.f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kChunk; ++j)
      if (s0 + j < splits) o += w(s0 + j) * v[j];
  }
  return o;
}

// Splits of `keys_per_split` keys that hold at least one of a row's `kv_len` keys (>= 1: with no key, split 0
// writes the empty result). The key ranges are fixed by the plan (capacity); the active count follows the length.
FLASHMAP_HD int active_splits(int kv_len, int keys_per_split, int splits) {
  const int n = kv_len > 0 ? (kv_len + keys_per_split - 1) / keys_per_split : 1;
  return n < splits ? n : splits;
}

}  // namespace flashmap::dit

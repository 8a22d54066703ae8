// The fused norms of the small-M linear (FLASHMAP_DIT_FUSED_NORMS; kernel: linear_kernel.cuh). References:
// flashmap_ext/ops/dit_reference.py::norm_linear and ::linear_kv_append (the unfused references chained).
//
// adaLN prologue (template flag kAdaLN of the mainloop): while the first pipeline stages load, each CTA computes
// the LayerNorm statistics of its own token rows (one warp per row over the whole K from L2, as adaln_kernel),
// then every x tile that lands in smem is modulated in place by the threads that copied it, before the barrier
// that hands the stage to the MMA: (x - mean) * rstd * (1 + scale) + shift, rounded to bf16 as adaln_kernel
// stores it. The weight stream and its cp.async pipeline are unchanged.
// Head epilogues (LinearEpilogue): y = act(acc + bias) is rounded to bf16 in the fp32 tile (as the unfused
// linear stores it), then one warp per (row, head) vector of the tile (head_dim divides the 128-column tile)
// runs norm_rows.cuh's RMSNorm/RoPE (or copies the vector) to its destination: the output (kHeadNorm) or a
// memory cache row (kKvAppend). Every reduction and rounding is the unfused kernels', so the results are too.
// With cluster split-K the ranks split the tile by rows (a head vector needs its whole row), summing in
// split order as the element-sliced epilogue does.
#pragma once

#include <cooperative_groups.h>
#include <cute/tensor.hpp>

#include "dit/dit_common.cuh"
#include "dit/dit_params.h"
#include "dit/head_map.h"
#include "dit/norm_rows.cuh"
#include "dit/split_reduce.h"

namespace flashmap::dit {

// Row statistics of token rows [m0, m0 + mm) into stats[m - m0]; a barrier makes them visible to the CTA.
template <class Traits>
__device__ __forceinline__ void adaln_prologue_stats(const LinearParams& p, int m0, int mm, RowMoments* stats) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int m = warp; m < mm; m += Traits::kWarps) {
    const RowMoments s = adaln_row_moments(p.x + (m0 + m) * p.x_stride, p.K, p.fuse.adaln_eps, lane);
    if (lane == 0) stats[m] = s;
  }
  __syncthreads();
}

// Modulates this thread's share of x tile `kt` in smem stage `stage` (the elements it copied: tXs/tXc are the
// mainloop's copy partitions of the x tile and of its coordinates; one copy atom is 8 consecutive k of one
// row, so shift and scale come in as one 16-byte vector each). Rows past M stay zero.
template <class TS, class TC>
__device__ __forceinline__ void adaln_prologue_modulate(const LinearParams& p, TS& tXs, const TC& tXc, int kt,
                                                        int stage, int m0, const RowMoments* stats) {
  using namespace cute;
  using Element = typename TS::value_type;
  static_assert(decltype(size<0>(tXs))::value == 8, "one copy atom = 8 bf16 (16 bytes) of one row");
  const LinearFusion& f = p.fuse;
  CUTE_UNROLL
  for (int i = 0; i < size<1>(tXs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<2>(tXs); ++j) {
      const int row = get<0>(tXc(0, i, j, kt)), k0 = get<1>(tXc(0, i, j, kt));
      if (row >= p.M) continue;
      const RowMoments s = stats[row - m0];
      const int64_t g = row / f.rows_per_cond;
      float sh[8], sc[8];
      unpack8(*reinterpret_cast<const uint4*>(f.shift + g * f.shift_stride + k0), sh);
      unpack8(*reinterpret_cast<const uint4*>(f.scale + g * f.scale_stride + k0), sc);
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) {
        Element& v = tXs(e, i, j, stage);
        v = Element::bitcast(float_to_bf16_bits(adaln_modulate(bf16_bits_to_float(v.raw()), s, sc[e], sh[e])));
      }
    }
  }
}

// The destination of head vector gh of row gm (head_map.h), and its norm weight (nullptr: copied as is).
template <LinearEpilogue kEpi>
__device__ __forceinline__ HeadDest head_dest(const LinearParams& p, int gm, int gh, bf16_bits** dest,
                                              const bf16_bits** norm) {
  const LinearFusion& f = p.fuse;
  if constexpr (kEpi == LinearEpilogue::kHeadNorm) {
    const bool rope = f.positions != nullptr;
    const HeadDest d = head_norm_dest(gm, gh, p.N, f.head_dim, f.heads, f.k_norm != nullptr, rope,
                                      rope ? f.positions[gm] : 0);
    *dest = d.offset < 0 ? nullptr : p.out + d.offset;
    *norm = d.norm < 0 ? nullptr : d.norm == 0 ? f.q_norm : f.k_norm;
    return d;
  } else {
    const CacheGeometry g{f.T, f.L, f.heads, f.cache_layer, f.cache_batch, f.cache_row, f.cache_head};
    const int b = gm / f.T;
    const HeadDest d = kv_append_dest(gm, gh, g, f.start[b], f.count[b]);
    *dest = d.offset < 0 ? nullptr : (d.cache ? f.v_cache : f.k_cache) + d.offset;
    *norm = d.norm < 0 ? nullptr : f.kv_norm + static_cast<int64_t>(d.norm) * f.head_dim;
    return d;
  }
}

// Whether the epilogue rotates, and the RoPE position of row gm (the same integer the unfused ops rotate at).
template <LinearEpilogue kEpi>
__device__ __forceinline__ bool epilogue_ropes(const LinearParams& p) {
  return kEpi == LinearEpilogue::kKvAppend || p.fuse.positions != nullptr;
}
template <LinearEpilogue kEpi>
__device__ __forceinline__ float rope_position(const LinearParams& p, int gm) {
  const LinearFusion& f = p.fuse;
  if constexpr (kEpi == LinearEpilogue::kHeadNorm) return static_cast<float>(f.positions[gm]);
  else return static_cast<float>(kv_append_row(gm, f.T, f.start[gm / f.T]));
}

// Room for the RoPE table of up to `rows` rows (cos/sin of every pair of a head, per row) after `tiles` fp32 tiles.
template <class Traits>
constexpr bool rope_table_fits(int tiles, int rows) {
  return tiles * Traits::kSmemEpilogue + rows * (Traits::kTileN / 2) * int(sizeof(float2)) <= Traits::kSmemBytes;
}

// The head epilogue over rows [r0, r1) of the fp32 tile (row stride Traits::kLdC); rope_table: smem for
// (r1 - r0) x head_dim / 2 float2 (the angles of a row are the same for all its heads, so they are computed
// once per row and pair, with the unfused kernel's formula, outside the per-vector loop). Every thread of the
// CTA calls it.
template <class Traits, LinearEpilogue kEpi>
__device__ __forceinline__ void head_epilogue(const LinearParams& p, float* tile, float2* rope_table, int n0, int m0,
                                              int nn, int r0, int r1) {
  using T = Traits;
  for (int idx = r0 * T::kTileN + threadIdx.x; idx < r1 * T::kTileN; idx += T::kThreads) {
    const int m = idx / T::kTileN, n = idx % T::kTileN;
    if (n >= nn) continue;
    float y = tile[m * T::kLdC + n];
    if (p.bias) y += bf16_bits_to_float(p.bias[n0 + n]);
    if (p.act == Activation::kGeluTanh) y = gelu_tanh(y);
    else if (p.act == Activation::kSilu) y = silu(y);
    tile[m * T::kLdC + n] = bf16_bits_to_float(float_to_bf16_bits(y));  // the unfused linear's output rounding
  }
  const int D = p.fuse.head_dim, per_row = nn / D, half = D / 2;
  if (epilogue_ropes<kEpi>(p)) {
    for (int idx = threadIdx.x; idx < (r1 - r0) * half; idx += T::kThreads)
      rope_table[idx] = rope_cos_sin(rope_position<kEpi>(p, m0 + r0 + idx / half), idx % half, D, p.fuse.theta);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int v = warp; v < (r1 - r0) * per_row; v += T::kWarps) {
    const TileHead h = tile_head(v, per_row, r0, n0, D);
    bf16_bits* dest;
    const bf16_bits* norm;
    const HeadDest d = head_dest<kEpi>(p, m0 + h.m, h.gh, &dest, &norm);
    if (d.offset < 0) continue;
    const float* src = tile + h.m * T::kLdC + h.c0;
    if (norm == nullptr) {
      for (int i = lane; i < D; i += 32) dest[i] = float_to_bf16_bits(src[i]);
      continue;
    }
    const float2* rot = rope_table + (h.m - r0) * half;
    rms_rope_vector([&](int i) { return src[i]; }, [&](int i, bf16_bits x) { dest[i] = x; }, norm, D, p.fuse.eps,
                    d.rope, [&](int i) { return rot[i]; }, lane);
  }
}

// Cluster split-K with a head epilogue: rank r sums, in split order, the rows of its row slice from every rank's
// tile into a second smem tile (after its own), then runs the head epilogue on them.
template <class Traits, LinearEpilogue kEpi>
__device__ __forceinline__ void cluster_head_epilogue(const LinearParams& p, float* sC, int n0, int m0, int nn,
                                                      int mm) {
  namespace cg = cooperative_groups;
  using T = Traits;
  static_assert(rope_table_fits<T>(2, T::kTileM / 2), "the summed rows (a second fp32 tile) and their RoPE table");
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const Slice rows = rank_slice(static_cast<int>(cluster.block_rank()), p.splits, mm);
  float* sum = sC + T::kTileM * T::kLdC;
  for (int idx = rows.begin * T::kTileN + threadIdx.x; idx < rows.end * T::kTileN; idx += T::kThreads) {
    const int off = (idx / T::kTileN) * T::kLdC + idx % T::kTileN;
    if (idx % T::kTileN >= nn) continue;
    sum[off] = sum_in_split_order_batched<kMaxClusterSplits>(
        [&](int sp) { return *cluster.map_shared_rank(sC + off, sp); }, p.splits);
  }
  __syncthreads();
  head_epilogue<T, kEpi>(p, sum, reinterpret_cast<float2*>(sum + T::kTileM * T::kLdC), n0, m0, nn, rows.begin,
                         rows.end);
  cluster.sync();  // every rank's tile stays alive until all ranks have read it
}

}  // namespace flashmap::dit

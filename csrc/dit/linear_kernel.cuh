// Small-M linear layer of the DiT drafter, a CuTe (CUTLASS) GEMM with fused epilogues (DESIGN.md §10).
// Reference: flashmap_ext/ops/dit_reference.py::linear and ::lm_head.
//
//   out[m, n] = residual[m, n] + gate[m / rows_per_gate, n] * act(sum_k x[m, k] * w[n, k] + bias[n])
//   argmax mode (LM head): tokens[m] = argmax_{n < valid_n} softcap(sum_k x[m, k] * w[n, k] + bias[n])
//
// Algorithm. M = B*K <= 64 tokens against N x K weights is a weight stream, so the GEMM is "swap-AB": the
// weight tile is the MMA's M operand (kTileN = 128 rows, 4 warps x 2 m16 atoms) and the tokens are its N
// operand (kTileM = 16 or 64). Both operands are K-major (nn.Linear layout), loaded by cp.async into a
// kStages-deep ring of 128-byte-swizzled smem tiles, read with ldmatrix, multiplied by mma.sync
// m16n8k16 bf16 -> fp32 (SM80 atoms; at these shapes HBM, not the MMA rate, bounds the time).
// Grid (tiles_n, splits, tiles_m). With split-K (splits > 1) each CTA writes its fp32 partial tile to the
// workspace, and the last CTA of a tile to arrive (atomic counter) sums all splits in split order
// (deterministic) and runs the epilogue. The epilogue stages the accumulators through smem so every
// global read/write of bias, gate, residual, out and logits is coalesced along n.
// With FLASHMAP_DIT_CLUSTER_SPLITK=1 the splits of a tile form one thread-block cluster instead and reduce
// through distributed shared memory (cluster_splitk_epilogue; at most kMaxClusterSplits splits).
// With FLASHMAP_DIT_FUSED_NORMS the launcher picks an instantiation with the adaLN prologue and/or a head
// epilogue (QK-norm/RoPE, or the memory-cache append): linear_fused.cuh.
// Argmax mode keeps splits = 1: each CTA reduces its 128 columns per token to one (value, index) pair,
// and the last CTA of the token tile reduces those over all column tiles. No K x V logits are written
// unless asked for.
// Invariants (checked by the glue): K % 64 == 0; x, w row strides multiples of 8 elements and 16-byte
// aligned bases; M >= 1, N >= 1; counters zero on entry (the kernel resets the ones it used).
#pragma once

#include <climits>

#include <cooperative_groups.h>
#include <cute/tensor.hpp>

#include "dit/dit_common.cuh"
#include "dit/dit_params.h"
#include "dit/dit_tuning.h"
#include "dit/linear_fused.cuh"
#include "dit/split_reduce.h"

namespace flashmap::dit {

template <int kTileM_>
struct LinearTraits {
  using Element = cute::bfloat16_t;
  static constexpr int kTileN = tuning::kLinearTileN;  // weight rows per CTA (MMA M side)
  static constexpr int kTileM = kTileM_;               // tokens per CTA (MMA N side)
  static constexpr int kTileK = tuning::kLinearTileK;
  static constexpr int kStages = tuning::kLinearStages;
  static constexpr int kThreads = tuning::kLinearThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kLdC = kTileN + 4;  // fp32 epilogue tile row stride: conflict-free acc stores

  // 8 x 64 bf16 row-major atom with the 128-byte XOR swizzle: conflict-free 16-byte cp.async writes and
  // ldmatrix reads of K-major tiles.
  using SmemAtom = decltype(cute::composition(
      cute::Swizzle<3, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kTileK>>, cute::Stride<cute::Int<kTileK>, cute::_1>>{}));
  using SmemLayoutW = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kTileN>, cute::Int<kTileK>, cute::Int<kStages>>{}));
  using SmemLayoutX = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kTileM>, cute::Int<kTileK>, cute::Int<kStages>>{}));
  // 128 threads as 16 rows x 8 threads, 8 bf16 (16 bytes) each: one 16 x 64 slab per copy step.
  using GmemCopy = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      cute::Layout<cute::Shape<cute::_16, cute::_8>, cute::Stride<cute::_8, cute::_1>>{},
      cute::Layout<cute::Shape<cute::_1, cute::_8>>{}));
  // 4 warps stacked along the weight rows; the 64 x 16 x 16 permutation tile makes each warp's B (tokens)
  // footprint 16 x 16, the shape one ldmatrix.x4 loads.
  using TiledMma = decltype(cute::make_tiled_mma(cute::SM80_16x8x16_F32BF16BF16F32_TN{},
                                                 cute::Layout<cute::Shape<cute::_4, cute::_1, cute::_1>>{},
                                                 cute::Tile<cute::_64, cute::_16, cute::_16>{}));
  using S2RAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;

  static constexpr int kSmemPipe =
      int(cute::cosize_v<SmemLayoutW> + cute::cosize_v<SmemLayoutX>) * int(sizeof(Element));
  static constexpr int kSmemEpilogue = kTileM * kLdC * int(sizeof(float));
  static constexpr int kSmemBytes = kSmemPipe > kSmemEpilogue ? kSmemPipe : kSmemEpilogue;
  static_assert(kThreads == 128 && kTileN == 128 && kTileK == 64, "layouts above assume these");
  static_assert(kTileM % 16 == 0, "token tile must be a multiple of the 16-row copy slab");
};

// Loads K-tile `kt` of the weight and token tiles into smem stage `stage`; rows past N (weights) or M
// (tokens) are zero-filled so the tails never read out of bounds.
template <class Traits, class TG, class TS, class TC>
__device__ __forceinline__ void load_rows(const typename Traits::GmemCopy& tiled_copy, const TG& g, TS& s,
                                          const TC& c, int kt, int stage, int rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size<1>(s); ++i) {
    const bool ok = get<0>(c(0, i, 0, kt)) < rows;
    CUTE_UNROLL
    for (int j = 0; j < size<2>(s); ++j) {
      if (ok) copy(tiled_copy, g(_, i, j, kt), s(_, i, j, stage));
      else clear(s(_, i, j, stage));
    }
  }
}

// Mainloop: accumulates x[m_tile] . w[n_tile]^T over K-tiles [kt_begin, kt_end) and leaves the fp32 tile
// in smem as sC[m * kLdC + n] (m < kTileM, n < kTileN). kAdaLN: x tiles pass through the adaLN prologue.
template <class Traits, bool kAdaLN = false>
__device__ __forceinline__ void linear_mainloop(const LinearParams& p, int n_blk, int m_blk, int kt_begin,
                                                int kt_end, char* smem) {
  using namespace cute;
  using T = Traits;
  using Element = typename T::Element;
  const int tid = threadIdx.x;

  Tensor mW = make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(p.w)), make_shape(p.N, p.K),
                          make_stride(p.w_stride, _1{}));
  Tensor mX = make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(p.x)), make_shape(p.M, p.K),
                          make_stride(p.x_stride, _1{}));
  auto tile_w = make_shape(Int<T::kTileN>{}, Int<T::kTileK>{});
  auto tile_x = make_shape(Int<T::kTileM>{}, Int<T::kTileK>{});
  Tensor gW = local_tile(mW, tile_w, make_coord(n_blk, _));  // (kTileN, kTileK, k_tiles)
  Tensor gX = local_tile(mX, tile_x, make_coord(m_blk, _));  // (kTileM, kTileK, k_tiles)
  Tensor cW = local_tile(make_identity_tensor(shape(mW)), tile_w, make_coord(n_blk, _));
  Tensor cX = local_tile(make_identity_tensor(shape(mX)), tile_x, make_coord(m_blk, _));
  Tensor sW = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename T::SmemLayoutW{});
  Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem) + cosize_v<typename T::SmemLayoutW>),
                          typename T::SmemLayoutX{});

  typename T::GmemCopy gmem_copy;
  auto thr_copy = gmem_copy.get_slice(tid);
  Tensor tWg = thr_copy.partition_S(gW);  // (CPY, CPY_N, CPY_K, k_tiles)
  Tensor tWs = thr_copy.partition_D(sW);  // (CPY, CPY_N, CPY_K, stages)
  Tensor tWc = thr_copy.partition_S(cW);
  Tensor tXg = thr_copy.partition_S(gX);
  Tensor tXs = thr_copy.partition_D(sX);
  Tensor tXc = thr_copy.partition_S(cX);

  typename T::TiledMma mma;
  auto thr_mma = mma.get_slice(tid);
  Tensor rW = thr_mma.partition_fragment_A(sW(_, _, 0));  // (MMA, MMA_M, MMA_K)
  Tensor rX = thr_mma.partition_fragment_B(sX(_, _, 0));  // (MMA, MMA_N, MMA_K)
  Tensor acc = partition_fragment_C(mma, Shape<Int<T::kTileN>, Int<T::kTileM>>{});
  clear(acc);
  auto s2r_w = make_tiled_copy_A(typename T::S2RAtom{}, mma);
  auto s2r_x = make_tiled_copy_B(typename T::S2RAtom{}, mma);
  auto s2r_thr_w = s2r_w.get_slice(tid);
  auto s2r_thr_x = s2r_x.get_slice(tid);
  Tensor sWv = s2r_thr_w.partition_S(sW);  // (CPY, MMA_M, MMA_K, stages)
  Tensor sXv = s2r_thr_x.partition_S(sX);
  Tensor rWv = s2r_thr_w.retile_D(rW);
  Tensor rXv = s2r_thr_x.retile_D(rX);

  // Ring of kStages tiles: tile t lives in stage t % kStages; one cp.async group per tile (empty groups
  // past the end keep the wait count uniform). Under programmatic dependent launch the first stages'
  // weights (no kernel of the step writes them) are in flight before the grid waits for its predecessor,
  // which writes x; they join the first tile's group, so tile t still lands with group t.
  const int n_tiles = kt_end - kt_begin;
  if (p.pdl) {
    CUTE_UNROLL
    for (int s = 0; s < T::kStages - 1; ++s)
      if (s < n_tiles) load_rows<T>(gmem_copy, tWg, tWs, tWc, kt_begin + s, s, p.N);
    grid_dependency_wait();
  }
  CUTE_UNROLL
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < n_tiles) {
      if (!p.pdl) load_rows<T>(gmem_copy, tWg, tWs, tWc, kt_begin + s, s, p.N);
      load_rows<T>(gmem_copy, tXg, tXs, tXc, kt_begin + s, s, p.M);
    }
    cp_async_fence();
  }
  [[maybe_unused]] RowMoments* adaln_stats = nullptr;
  if constexpr (kAdaLN) {  // the row statistics while the first stages load
    __shared__ RowMoments stats[T::kTileM];
    adaln_stats = stats;
    adaln_prologue_stats<T>(p, m_blk * T::kTileM, min(T::kTileM, p.M - m_blk * T::kTileM), stats);
  }
  CUTE_NO_UNROLL
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<T::kStages - 2>();  // tile t has landed ...
    if constexpr (kAdaLN)
      adaln_prologue_modulate(p, tXs, tXc, kt_begin + t, t % T::kStages, m_blk * T::kTileM, adaln_stats);
    __syncthreads();                  // ... for every thread, and tile t-1's stage is free again
    const int next = t + T::kStages - 1;
    if (next < n_tiles) {
      load_rows<T>(gmem_copy, tWg, tWs, tWc, kt_begin + next, next % T::kStages, p.N);
      load_rows<T>(gmem_copy, tXg, tXs, tXc, kt_begin + next, next % T::kStages, p.M);
    }
    cp_async_fence();
    const int stage = t % T::kStages;
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(rW); ++kk) {
      copy(s2r_w, sWv(_, _, kk, stage), rWv(_, _, kk));
      copy(s2r_x, sXv(_, _, kk, stage), rXv(_, _, kk));
      gemm(mma, rW(_, _, kk), rX(_, _, kk), acc);
    }
  }
  cp_async_wait<0>();
  grid_dependents_launch();  // the next kernel may start its weight loads during this epilogue
  __syncthreads();  // the pipeline smem is now reused as the fp32 epilogue tile

  float* sC = reinterpret_cast<float*>(smem);
  Tensor cC = make_identity_tensor(Shape<Int<T::kTileN>, Int<T::kTileM>>{});
  Tensor tCc = thr_mma.partition_C(cC);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) sC[get<1>(tCc(i)) * T::kLdC + get<0>(tCc(i))] = acc(i);
  __syncthreads();
}

// Returns true in the CTA that arrives last at `counter` (of `expected` arrivals) and resets the counter.
// Callers write their partial results before calling; the winner may then read every CTA's partials.
__device__ __forceinline__ bool arrive_last(int* counter, int expected) {
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    s_last = prev == expected - 1;
    if (s_last) *counter = 0;
  }
  __syncthreads();
  if (s_last) __threadfence();
  return s_last;
}

// out[gm, gn] from the accumulated y: bias, activation, gate, residual, one rounding to bf16.
__device__ __forceinline__ void epilogue_element(const LinearParams& p, float y, int gm, int gn) {
  if (p.bias) y += bf16_bits_to_float(p.bias[gn]);
  if (p.act == Activation::kGeluTanh) y = gelu_tanh(y);
  else if (p.act == Activation::kSilu) y = silu(y);
  if (p.gate) y *= bf16_bits_to_float(p.gate[static_cast<int64_t>(gm / p.rows_per_gate) * p.gate_stride + gn]);
  if (p.residual) y += bf16_bits_to_float(p.residual[gm * p.residual_stride + gn]);
  p.out[static_cast<int64_t>(gm) * p.N + gn] = float_to_bf16_bits(y);
}

template <class Traits>
__device__ __forceinline__ void linear_epilogue(const LinearParams& p, const float* sC, int n0, int m0,
                                                int nn, int mm) {
  for (int idx = threadIdx.x; idx < mm * Traits::kTileN; idx += Traits::kThreads) {
    const int m = idx / Traits::kTileN, n = idx % Traits::kTileN;
    if (n < nn) epilogue_element(p, sC[m * Traits::kLdC + n], m0 + m, n0 + n);
  }
}

// Split-K inside a thread-block cluster of p.splits CTAs along the grid's y (FLASHMAP_DIT_CLUSTER_SPLITK=1):
// each split's fp32 tile stays in its own smem; after a cluster barrier, rank r sums every rank's tile over
// the elements of its slice, in rank (= split) order through distributed shared memory, and runs their
// epilogue. No global partials, no counters; the second barrier keeps each tile alive until all have read it.
template <class Traits>
__device__ __forceinline__ void cluster_splitk_epilogue(const LinearParams& p, float* sC, int n0, int m0,
                                                        int nn, int mm) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const Slice mine = rank_slice(static_cast<int>(cluster.block_rank()), p.splits, mm * Traits::kTileN);
  for (int idx = mine.begin + threadIdx.x; idx < mine.end; idx += Traits::kThreads) {
    const int m = idx / Traits::kTileN, n = idx % Traits::kTileN;
    if (n >= nn) continue;
    const int off = m * Traits::kLdC + n;
    const float y = sum_in_split_order_batched<kMaxClusterSplits>(
        [&](int sp) { return *cluster.map_shared_rank(sC + off, sp); }, p.splits);
    epilogue_element(p, y, m0 + m, n0 + n);
  }
  cluster.sync();
}

// LM head: softcap, optional fp32 logits, per-token argmax of this column tile, then the cross-tile
// reduction in the last CTA of the token tile.
template <class Traits>
__device__ __forceinline__ void argmax_epilogue(const LinearParams& p, float* sC, int n_blk, int m_blk,
                                                int n0, int m0, int nn, int mm) {
  using T = Traits;
  for (int idx = threadIdx.x; idx < mm * T::kTileN; idx += T::kThreads) {
    const int m = idx / T::kTileN, n = idx % T::kTileN;
    if (n >= nn) continue;
    float y = sC[m * T::kLdC + n];
    if (p.bias) y += bf16_bits_to_float(p.bias[n0 + n]);
    if (p.softcap > 0.f) y = p.softcap * tanhf(y / p.softcap);
    sC[m * T::kLdC + n] = y;
    if (p.logits) p.logits[static_cast<int64_t>(m0 + m) * p.N + n0 + n] = y;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int m = warp; m < mm; m += T::kWarps) {
    float v = -INFINITY;
    int i = INT_MAX;
    for (int n = lane; n < nn && n0 + n < p.valid_n; n += 32) {
      if (argmax_better(sC[m * T::kLdC + n], n0 + n, v, i)) v = sC[m * T::kLdC + n], i = n0 + n;
    }
    warp_argmax(v, i);
    if (lane == 0) {
      p.argmax_val[static_cast<int64_t>(n_blk) * p.M + m0 + m] = v;
      p.argmax_idx[static_cast<int64_t>(n_blk) * p.M + m0 + m] = i;
    }
  }
  const int tiles_n = gridDim.x;
  if (!arrive_last(p.counters + tiles_n * gridDim.z + m_blk, tiles_n)) return;
  for (int m = warp; m < mm; m += T::kWarps) {
    float v = -INFINITY;
    int i = INT_MAX;
    for (int t = lane; t < tiles_n; t += 32) {
      const float tv = __ldcg(p.argmax_val + static_cast<int64_t>(t) * p.M + m0 + m);
      const int ti = __ldcg(p.argmax_idx + static_cast<int64_t>(t) * p.M + m0 + m);
      if (argmax_better(tv, ti, v, i)) v = tv, i = ti;
    }
    warp_argmax(v, i);
    if (lane == 0) p.tokens[m0 + m] = i == INT_MAX ? 0 : i;
  }
}

template <class Traits, bool kAdaLN = false, LinearEpilogue kEpi = LinearEpilogue::kStore>
__global__ void __launch_bounds__(Traits::kThreads) linear_kernel(LinearParams p) {
  extern __shared__ __align__(128) char smem[];
  using T = Traits;
  const int n_blk = blockIdx.x, split = blockIdx.y, m_blk = blockIdx.z;
  const int k_tiles = p.K / T::kTileK;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(split) * k_tiles / p.splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(split + 1) * k_tiles / p.splits);
  linear_mainloop<T, kAdaLN>(p, n_blk, m_blk, kt_begin, kt_end, smem);

  float* sC = reinterpret_cast<float*>(smem);
  const int n0 = n_blk * T::kTileN, m0 = m_blk * T::kTileM;
  const int nn = min(T::kTileN, p.N - n0), mm = min(T::kTileM, p.M - m0);
  if (p.splits > 1 && p.cluster_splitk) {
    if constexpr (kEpi != LinearEpilogue::kStore) cluster_head_epilogue<T, kEpi>(p, sC, n0, m0, nn, mm);
    else cluster_splitk_epilogue<T>(p, sC, n0, m0, nn, mm);
    return;
  }
  if (p.splits > 1) {
    // Split-K fixup: publish this split's tile, the last arriving CTA sums all splits in order.
    float* mine = p.partials + static_cast<int64_t>(split) * p.M * p.N;
    for (int idx = threadIdx.x; idx < mm * T::kTileN; idx += T::kThreads) {
      const int m = idx / T::kTileN, n = idx % T::kTileN;
      if (n < nn) mine[static_cast<int64_t>(m0 + m) * p.N + n0 + n] = sC[m * T::kLdC + n];
    }
    if (!arrive_last(p.counters + m_blk * gridDim.x + n_blk, p.splits)) return;
    for (int idx = threadIdx.x; idx < mm * T::kTileN; idx += T::kThreads) {
      const int m = idx / T::kTileN, n = idx % T::kTileN;
      if (n >= nn) continue;
      const float* col = p.partials + static_cast<int64_t>(m0 + m) * p.N + n0 + n;
      const int64_t split_stride = static_cast<int64_t>(p.M) * p.N;
      auto load = [&](int sp) { return __ldcg(col + sp * split_stride); };
      // FLASHMAP_DIT_BATCHED_FIXUP=1: all (<= 16) split loads in flight at once; same sum, same order.
      sC[m * T::kLdC + n] = p.batched_fixup ? sum_in_split_order_batched<tuning::kLinearMaxSplits>(load, p.splits)
                                            : sum_in_split_order(load, p.splits);
    }
    __syncthreads();
  }
  if constexpr (kEpi != LinearEpilogue::kStore) {
    static_assert(rope_table_fits<T>(1, T::kTileM), "the fp32 tile and its RoPE table");
    head_epilogue<T, kEpi>(p, sC, reinterpret_cast<float2*>(sC + T::kTileM * T::kLdC), n0, m0, nn, 0, mm);
  } else if (p.argmax) argmax_epilogue<T>(p, sC, n_blk, m_blk, n0, m0, nn, mm);
  else linear_epilogue<T>(p, sC, n0, m0, nn, mm);
}

}  // namespace flashmap::dit

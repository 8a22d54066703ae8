// Slot self-attention and memory cross-attention of the DiT drafter in one flash-decoding kernel
// (DESIGN.md §5.2, §10). Reference: flashmap_ext/ops/dit_reference.py::attention.
//
//   out[b, i, h] = sum_j softmax_j(scale * q[b, i, h] . k[b, j, h']) v[b, j, h'],  j < kv_len[b],
//   h' = h / (Hq / Hkv) (grouped heads). A row with no valid key yields 0.
// Self-attention: q, k, v are views of the slots' fused qkv projection (Skv = K slots, no kv_len).
// Cross-attention: k, v are views of the layer's memory cache [B, Lmax, 2, H, D] with kv_len = the
// committed length; the grid is sized by Lmax (capacity), never by the data, so a captured CUDA graph
// stays valid as the memory grows.
//
// Algorithm. One CTA per (key split, query head, batch row x 16-query tile). The CTA streams its keys in
// 64-key blocks through a 2-stage cp.async ring (smem rows padded by 16 bytes: conflict-free ldmatrix and
// 32-bit loads). Each of the 4 warps owns 16 keys of every block and runs its own online softmax:
//   S (16 x 16) = Q K^T  with mma.sync m16n8k16 (Q fragments live in registers for the whole CTA),
//   P = exp2(S * scale * log2 e - m), O (16 x D) = O * exp2(m_old - m) + P V  (P reused as the A operand,
//   V read with ldmatrix.trans). At the end the 4 warp states (m, l, O) merge through smem. With one
// split the CTA writes out = O / l; with several, it writes (O / l, m + log2 l) to the workspace and the
// last split to arrive (atomic counter) merges all splits in split order (deterministic). Switches
// (dit_switches.h, off by default): FLASHMAP_DIT_LENGTH_SPLITS (only the splits holding keys run and merge)
// and FLASHMAP_DIT_PARALLEL_MERGE (merge_splits_parallel: the same sums, loads batched).
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4): A regs {(g, 2t), (g+8, 2t),
// (g, 2t+8), (g+8, 2t+8)}, B regs {(k = 2t, n = g), (k = 2t+8, n = g)}, C {(g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1)}, pairs packed low-first.
// Invariants (checked by the glue): D in {64, 128}; all strides multiples of 8 elements; 16-byte aligned
// bases; counters zero on entry (the kernel resets the ones it used).
#pragma once

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "dit/dit_common.cuh"
#include "dit/dit_params.h"
#include "dit/dit_tuning.h"
#include "dit/split_reduce.h"

namespace flashmap::dit {

template <int kHeadDim>
struct AttentionTraits {
  static constexpr int kD = kHeadDim;
  static constexpr int kWarps = tuning::kAttnWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQ = tuning::kAttnQueriesPerTile;
  static constexpr int kBlock = tuning::kAttnKeysPerBlock;
  static constexpr int kStages = tuning::kAttnStages;
  static constexpr int kLd = kD + tuning::kAttnRowPad;  // smem row stride (elements)
  static constexpr int kSmemKV = kStages * 2 * kBlock * kLd * 2;
  static constexpr int kSmemMerge = (kWarps * kQ * kD + 2 * kWarps * kQ) * 4;
  static constexpr int kSmemBytes = kSmemKV > kSmemMerge ? kSmemKV : kSmemMerge;
  static_assert(kD % 16 == 0 && kQ == 16 && kBlock == 16 * kWarps, "one m16 tile, 16 keys per warp");
};

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0, b1, d[0],
                                            d[1], d[2], d[3]);
}

__device__ __forceinline__ uint32_t ld_u32(const bf16_bits* ptr) {
  return *reinterpret_cast<const uint32_t*>(ptr);
}

// Issues the cp.async copies of key block `blk` (keys [key0, key0 + kBlock) of this split) into `stage`;
// keys at or past key_end are zero-filled (the cache rows past kv_len may hold anything, even NaN).
template <class T>
__device__ __forceinline__ void load_kv_block(const AttentionParams& p, const bf16_bits* kbase,
                                              const bf16_bits* vbase, bf16_bits* sK, bf16_bits* sV, int key0,
                                              int key_end) {
  constexpr int kChunks = T::kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < T::kBlock * kChunks; c += T::kThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = key0 + row < key_end;
    const int64_t key = ok ? key0 + row : 0;
    using Cp = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
    Cp::copy(*reinterpret_cast<const cute::uint128_t*>(kbase + key * p.k_row + col),
             *reinterpret_cast<cute::uint128_t*>(sK + row * T::kLd + col), ok);
    Cp::copy(*reinterpret_cast<const cute::uint128_t*>(vbase + key * p.v_row + col),
             *reinterpret_cast<cute::uint128_t*>(sV + row * T::kLd + col), ok);
  }
}

// Online-softmax state of one warp: rows g and g + 8 of the 16-query tile, partial row sums per lane.
template <int kD>
struct WarpSoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float o[kD / 8][4] = {};
};

// One warp's 16 keys of a block: S = Q K^T, online softmax update, O += P V.
template <class T>
__device__ __forceinline__ void attend_16_keys(WarpSoftmaxState<T::kD>& st, const uint32_t (&qf)[T::kD / 16][4],
                                               const bf16_bits* sK, const bf16_bits* sV, int key_base,
                                               int key_end, float scale_log2) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float s[2][4] = {};
#pragma unroll
  for (int kk = 0; kk < T::kD / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bf16_bits* krow = sK + (j * 8 + g) * T::kLd + kk * 16 + 2 * t;
      mma_16816(s[j], qf[kk], ld_u32(krow), ld_u32(krow + 8));
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_base + j * 8 + 2 * t + (e & 1);
      s[j][e] = key < key_end ? s[j][e] * scale_log2 : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    }
  }
  float corr[2], m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(st.m[r], mx[r]);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: keep exp2 finite (it gives 0)
    corr[r] = exp2f(st.m[r] - m_use[r]);
    st.m[r] = m_new;
    st.l[r] *= corr[r];
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp2f(s[j][e] - m_use[e >> 1]);
      st.l[e >> 1] += s[j][e];
    }
  }
#pragma unroll
  for (int n = 0; n < T::kD / 8; ++n) {
    st.o[n][0] *= corr[0], st.o[n][1] *= corr[0], st.o[n][2] *= corr[1], st.o[n][3] *= corr[1];
  }
  const uint32_t a[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]),
                         pack_bf16x2(s[1][0], s[1][1]), pack_bf16x2(s[1][2], s[1][3])};
  // ldmatrix.x4.trans: lanes 8i..8i+7 address rows of matrix i = (keys (i & 1) * 8 + r, columns
  // (i >> 1) * 8 + [0, 8)); registers 0-1 are B of n-atom 2jj, registers 2-3 of n-atom 2jj + 1.
  const int mat = lane / 8, r = lane % 8;
  const bf16_bits* vrow = sV + ((mat & 1) * 8 + r) * T::kLd + (mat >> 1) * 8;
#pragma unroll
  for (int jj = 0; jj < T::kD / 16; ++jj) {
    uint32_t b[4];
    cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(vrow + jj * 16), b[0], b[1], b[2],
                                  b[3]);
    mma_16816(st.o[2 * jj], a, b[0], b[1]);
    mma_16816(st.o[2 * jj + 1], a, b[2], b[3]);
  }
}

// Merges the warps' states through smem and writes this CTA's result: the final output (one split) or the
// split's normalised partial and log2-sum-exp.
template <class T>
__device__ __forceinline__ void merge_warps(const AttentionParams& p, WarpSoftmaxState<T::kD>& st, float* smem,
                                            int b, int h, int split, int q0, int active) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float* sO = smem;                              // [kWarps][kQ][kD]
  float* sM = sO + T::kWarps * T::kQ * T::kD;    // [kWarps][kQ]
  float* sL = sM + T::kWarps * T::kQ;            // [kWarps][kQ]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
    st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
  }
  float* mine = sO + warp * T::kQ * T::kD;
#pragma unroll
  for (int n = 0; n < T::kD / 8; ++n) {
    mine[g * T::kD + n * 8 + 2 * t] = st.o[n][0];
    mine[g * T::kD + n * 8 + 2 * t + 1] = st.o[n][1];
    mine[(g + 8) * T::kD + n * 8 + 2 * t] = st.o[n][2];
    mine[(g + 8) * T::kD + n * 8 + 2 * t + 1] = st.o[n][3];
  }
  if (t == 0) {
    sM[warp * T::kQ + g] = st.m[0], sM[warp * T::kQ + g + 8] = st.m[1];
    sL[warp * T::kQ + g] = st.l[0], sL[warp * T::kQ + g + 8] = st.l[1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < T::kQ * T::kD; idx += T::kThreads) {
    const int row = idx / T::kD, col = idx % T::kD, q = q0 + row;
    if (q >= p.Sq) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) mx = fmaxf(mx, sM[w * T::kQ + row]);
    const float m_use = mx == -INFINITY ? 0.f : mx;
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) {
      const float f = exp2f(sM[w * T::kQ + row] - m_use);
      l += f * sL[w * T::kQ + row];
      o += f * sO[(w * T::kQ + row) * T::kD + col];
    }
    const float val = l > 0.f ? o / l : 0.f;
    if (active == 1) {
      p.out[((static_cast<int64_t>(b) * p.Sq + q) * p.Hq + h) * p.D + col] = float_to_bf16_bits(val);
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.Hq + h) * p.splits + split;
      p.partial_o[(slot * p.Sq + q) * p.D + col] = val;
      if (col == 0) p.partial_lse[slot * p.Sq + q] = l > 0.f ? m_use + log2f(l) : -INFINITY;
    }
  }
}

// Last split of a (b, h, q-tile) to arrive: out = sum_s 2^(lse_s - max) O_s / sum_s 2^(lse_s - max), over the
// first `splits` splits (all of them, or the active ones).
template <class T>
__device__ __forceinline__ void merge_splits(const AttentionParams& p, int b, int h, int q0, int splits) {
  const int64_t slot0 = (static_cast<int64_t>(b) * p.Hq + h) * p.splits;
  for (int idx = threadIdx.x; idx < T::kQ * T::kD; idx += T::kThreads) {
    const int row = idx / T::kD, col = idx % T::kD, q = q0 + row;
    if (q >= p.Sq) continue;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(p.partial_lse + (slot0 + s) * p.Sq + q));
    float wsum = 0.f, o = 0.f;
    if (mx != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float w = exp2f(__ldcg(p.partial_lse + (slot0 + s) * p.Sq + q) - mx);
        wsum += w;
        o += w * __ldcg(p.partial_o + ((slot0 + s) * p.Sq + q) * p.D + col);
      }
    }
    p.out[((static_cast<int64_t>(b) * p.Sq + q) * p.Hq + h) * p.D + col] =
        float_to_bf16_bits(wsum > 0.f ? o / wsum : 0.f);
  }
}

// merge_splits with the same sums in the same order (FLASHMAP_DIT_PARALLEL_MERGE=1): every lse is read once
// (all in parallel) into smem, one thread per query row turns them into weights (merge_weights), and each
// output element's partial loads are issued 8 at a time (weighted_sum_in_split_order). smem: the CTA's
// (free) K/V staging area, kQ x (kAttnMaxSplits + 1) floats.
template <class T>
__device__ __forceinline__ void merge_splits_parallel(const AttentionParams& p, int b, int h, int q0, int splits,
                                                      float* smem) {
  constexpr int kLd = tuning::kAttnMaxSplits + 1;  // weights of row r at smem[r * kLd], their sum after them
  const int64_t slot0 = (static_cast<int64_t>(b) * p.Hq + h) * p.splits;
  for (int idx = threadIdx.x; idx < T::kQ * splits; idx += T::kThreads) {
    const int row = idx / splits, s = idx % splits, q = q0 + row;
    smem[row * kLd + s] = q < p.Sq ? __ldcg(p.partial_lse + (slot0 + s) * p.Sq + q) : -INFINITY;
  }
  __syncthreads();
  if (threadIdx.x < T::kQ) {  // the weights overwrite the lse in place (merge_weights allows it)
    float* w = smem + threadIdx.x * kLd;
    w[kLd - 1] = merge_weights([&](int s) { return w[s]; }, splits, w);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < T::kQ * T::kD; idx += T::kThreads) {
    const int row = idx / T::kD, col = idx % T::kD, q = q0 + row;
    if (q >= p.Sq) continue;
    const float* w = smem + row * kLd;
    const float wsum = w[kLd - 1];
    const float o = weighted_sum_in_split_order<8>(
        [&](int s) { return w[s]; },
        [&](int s) { return __ldcg(p.partial_o + ((slot0 + s) * p.Sq + q) * p.D + col); }, splits);
    p.out[((static_cast<int64_t>(b) * p.Sq + q) * p.Hq + h) * p.D + col] =
        float_to_bf16_bits(wsum > 0.f ? o / wsum : 0.f);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads) attention_kernel(AttentionParams p) {
  extern __shared__ __align__(128) char smem_raw[];
  bf16_bits* smem = reinterpret_cast<bf16_bits*>(smem_raw);
  const int q_tiles = (p.Sq + T::kQ - 1) / T::kQ;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z / q_tiles, q0 = (blockIdx.z % q_tiles) * T::kQ;
  const int hk = h / (p.Hq / p.Hkv);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  grid_dependency_wait();  // q, k, v and kv_len all come from earlier kernels
  const int kv_len = p.kv_len ? min(max(p.kv_len[b], 0), p.Skv) : p.Skv;
  // FLASHMAP_DIT_LENGTH_SPLITS=1: splits past the row's keys neither run nor arrive (graph-safe: on the device).
  const int active = p.length_splits ? active_splits(kv_len, p.keys_per_split, p.splits) : p.splits;
  if (split >= active) return;
  const int key_begin = split * p.keys_per_split;
  const int key_end = min(key_begin + p.keys_per_split, kv_len);
  const int n_blocks = key_end > key_begin ? (key_end - key_begin + T::kBlock - 1) / T::kBlock : 0;
  const bf16_bits* kbase = p.k + b * p.k_batch + hk * p.k_head;
  const bf16_bits* vbase = p.v + b * p.v_batch + hk * p.v_head;
  constexpr int kStageElems = T::kBlock * T::kLd;
  auto sK = [&](int stage) { return smem + (2 * stage) * kStageElems; };
  auto sV = [&](int stage) { return smem + (2 * stage + 1) * kStageElems; };

  if (n_blocks > 0) load_kv_block<T>(p, kbase, vbase, sK(0), sV(0), key_begin, key_end);
  cute::cp_async_fence();

  // Q fragments (A operand) for the whole key range; query rows past Sq are zero.
  uint32_t qf[T::kD / 16][4];
  const bf16_bits* qb = p.q + b * p.q_batch + h * p.q_head;
  const bool ok0 = q0 + g < p.Sq, ok1 = q0 + g + 8 < p.Sq;
  const bf16_bits* q_r0 = qb + (ok0 ? q0 + g : 0) * p.q_row;
  const bf16_bits* q_r1 = qb + (ok1 ? q0 + g + 8 : 0) * p.q_row;
#pragma unroll
  for (int kk = 0; kk < T::kD / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    qf[kk][0] = ok0 ? ld_u32(q_r0 + c) : 0u;
    qf[kk][1] = ok1 ? ld_u32(q_r1 + c) : 0u;
    qf[kk][2] = ok0 ? ld_u32(q_r0 + c + 8) : 0u;
    qf[kk][3] = ok1 ? ld_u32(q_r1 + c + 8) : 0u;
  }

  const float scale_log2 = p.scale * 1.4426950408889634f;
  WarpSoftmaxState<T::kD> st;
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int key0 = key_begin + blk * T::kBlock;
    if (blk + 1 < n_blocks) load_kv_block<T>(p, kbase, vbase, sK((blk + 1) % 2), sV((blk + 1) % 2),
                                             key0 + T::kBlock, key_end);
    cute::cp_async_fence();
    cute::cp_async_wait<1>();  // block blk has landed
    __syncthreads();
    attend_16_keys<T>(st, qf, sK(blk % 2) + warp * 16 * T::kLd, sV(blk % 2) + warp * 16 * T::kLd,
                      key0 + warp * 16, key_end, scale_log2);
    __syncthreads();  // the next iteration refills this stage
  }
  cute::cp_async_wait<0>();
  grid_dependents_launch();
  __syncthreads();  // K/V smem is reused for the merge
  merge_warps<T>(p, st, reinterpret_cast<float*>(smem_raw), b, h, split, q0, active);
  if (active == 1) return;
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.counters + (static_cast<int64_t>(b) * p.Hq + h) * q_tiles + q0 / T::kQ;
    s_last = atomicAdd(counter, 1) == active - 1;
    if (s_last) *counter = 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (p.parallel_merge) merge_splits_parallel<T>(p, b, h, q0, active, reinterpret_cast<float*>(smem_raw));
  else merge_splits<T>(p, b, h, q0, active);
}

}  // namespace flashmap::dit

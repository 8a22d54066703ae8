// verify — CUDA kernels (reference: flashmap_ext/ops/verify_reference.py::verify_reference; CPU twin:
// verify_cpu.cpp; shared rules: verify_core.h). No torch types here: the glue is verify_cuda.cpp.
//
// Algorithm. Every slot's accept decision depends only on its own logits row and its own coin (coins are
// keyed by position + slot, not by the outcome of earlier slots), so all K+1 slots of all rows are
// judged in parallel: verify_slot_kernel runs one CTA per logits row (b, i) and writes a packed
// (candidate token, accepted?, status) word into tokens[b, i]; verify_combine_kernel then finds each
// row's first non-accepted slot and rewrites the row in place. Two launches, no host sync, no
// allocation, fixed output shapes: CUDA-graph safe.
//
// One slot CTA (1024 threads) reads its row of V logits once for the common cases: each warp sweeps
// "tiles" of 256 consecutive ids (lane l holds 8 of them, read as 16-byte vectors when the row is aligned,
// so a warp reads 512 contiguous bytes per load; a scalar tail for the last tile); per tile
// it keeps the max and Σ exp((l − m_tile)/T) in shared memory (online softmax by tile), and per thread the
// max/argmax/finiteness. The global sum is then the tile sums rescaled to the global max, added in tile
// order (deterministic). The emitted token of a rejected slot is an inverse-CDF sample: one warp scans
// the tile sums to find the tile holding u·R, then scans that tile's 256 ids. Top-k/top-p thresholds
// are radix selections over order keys (4 passes of 8-bit digits; mass histograms in 2^-40 fixed point,
// so the integer atomics are exact and the result is deterministic), followed by a filtered re-sweep.
// All arithmetic is fp32 (bf16/fp16 logits converted on load).
#include <cuda_runtime.h>

#include <cstdint>

#include "verify/verify_core.h"
#include "verify/verify_launch.h"
#include "verify/verify_pack.cuh"
#include "verify/verify_smem.h"

namespace flashmap {
namespace {

constexpr int kThreads = 1024;              // one CTA per logits row: enough loads in flight for one SM
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 8;                 // ids per lane per tile
constexpr int kTile = 32 * kPerLane;        // ids per warp tile
constexpr float kInf = __builtin_huge_valf();
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed-point unit of the top-p mass histogram

// --- warp / block reductions (fixed shuffle trees: deterministic) ----------------------------------
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// (value, index): larger value wins, ties go to the lower index (torch.argmax).
__device__ __forceinline__ void warp_argmax(float& v, int64_t& j) {
  for (int o = 16; o; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oj = __shfl_xor_sync(0xffffffffu, j, o);
    if (ov > v || (ov == v && oj < j)) { v = ov; j = oj; }
  }
}
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

struct BlockScratch {
  float f[kWarps];
  int64_t j[kWarps];
  int flags[kWarps];
  unsigned long long hist[256];
  float bcast_f;
  int64_t bcast_j;
  int bcast_flags;
};

// Per-thread sweep state of pass 1.
struct RowStats {
  float max = -kInf;
  int64_t argmax = 0;
  int flags = 0;  // 1 = NaN or +inf seen, 2 = a finite value seen
};

__device__ RowStats block_row_stats(RowStats s, BlockScratch& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(s.max, s.argmax);
  for (int o = 16; o; o >>= 1) s.flags |= __shfl_xor_sync(0xffffffffu, s.flags, o);
  if (lane == 0) { sh.f[warp] = s.max; sh.j[warp] = s.argmax; sh.flags[warp] = s.flags; }
  __syncthreads();
  if (warp == 0) {
    s.max = sh.f[lane];
    s.argmax = sh.j[lane];
    s.flags = sh.flags[lane];
    warp_argmax(s.max, s.argmax);
    for (int o = 16; o; o >>= 1) s.flags |= __shfl_xor_sync(0xffffffffu, s.flags, o);
    if (lane == 0) { sh.bcast_f = s.max; sh.bcast_j = s.argmax; sh.bcast_flags = s.flags; }
  }
  __syncthreads();
  return RowStats{sh.bcast_f, sh.bcast_j, sh.bcast_flags};
}

// --- one logits row as seen by a slot CTA -----------------------------------------------------------
template <LogitDType D>
struct Row {
  using T = typename LogitLoad<D>::T;
  const T* l;
  int64_t vv;      // valid ids
  int64_t tiles;   // ceil(vv / kTile)
  float max;       // global max logit (set after pass 1)
  float inv_t;     // 1 / temperature
  uint32_t kmin;   // keep ids with float_key(logit) >= kmin (0 = all)

  bool vec;        // the row starts 16-byte aligned: full tiles are read as 16-byte vectors

  __device__ float load(int64_t j) const { return j < vv ? LogitLoad<D>::load(l, j) : -kInf; }
  // Unnormalised target weight e_j = exp((l_j − max)/T) of a kept id, else 0.
  __device__ float weight(float v) const {
    return float_key(v) >= kmin && v > -kInf ? __expf((v - max) * inv_t) : 0.f;
  }

  // Sweep layout: a lane's kPerLane ids of a tile are kPerLane / kVec runs of kVec consecutive ids (one
  // 16-byte vector each) and consecutive lanes hold consecutive runs, so each vector slot of a warp
  // reads 512 contiguous bytes. Within a lane, ids increase with k (argmax ties keep the lowest id).
  static constexpr int kVec = 16 / sizeof(T);  // 4 fp32 or 8 fp16/bf16 ids per vector
  static_assert(kPerLane % kVec == 0, "a lane's ids are whole vectors");
  __device__ static int64_t sweep_id(int64_t t, int k, int lane) {
    return t * kTile + (k / kVec) * (32 * kVec) + lane * kVec + k % kVec;
  }
  // kVec consecutive ids from `first` (a multiple of kVec): one 16-byte load when they are valid ids of an
  // aligned row, else scalar loads (-inf past the end).
  __device__ void load_run(int64_t first, float (&v)[kVec]) const {
    if (vec && first + kVec <= vv) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(l + first));
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if constexpr (sizeof(T) == 4) {
          v[e] = __uint_as_float(words[e]);
        } else {
          const T half = static_cast<T>(words[e / 2] >> (16 * (e % 2)));  // little-endian: low half first
          v[e] = LogitLoad<D>::load(&half, 0);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = load(first + e);
    }
  }
  // The lane's values of tile t in sweep layout.
  __device__ void load_tile(int64_t t, int lane, float (&v)[kPerLane]) const {
#pragma unroll
    for (int c = 0; c < kPerLane / kVec; ++c) {
      float run[kVec];
      load_run(sweep_id(t, c * kVec, lane), run);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[c * kVec + e] = run[e];
    }
  }
};

// Pass 1: per-thread max/argmax/finiteness over all ids; with `tiles` set, per-tile (max, Σ exp) of
// kept ids into tile_max/tile_sum (relative to the tile max). Reads in sweep layout (Row::load_tile): a
// tile's members are the same 256 ids as in the other passes, only their order within the sum differs.
template <LogitDType D>
__device__ RowStats sweep_stats(const Row<D>& row, bool tiles, float* tile_max, float* tile_sum,
                                BlockScratch& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  RowStats s;
  float next[kPerLane];  // the warp's next tile, loaded one iteration ahead: twice the bytes in flight
  row.load_tile(warp, lane, next);
  for (int64_t t = warp; t < row.tiles; t += kWarps) {
    float v[kPerLane];
    float m = -kInf;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) v[k] = next[k];
    row.load_tile(t + kWarps, lane, next);  // -inf past the end
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t j = Row<D>::sweep_id(t, k, lane);
      if (j < row.vv) {
        s.flags |= (isnan(v[k]) || v[k] == kInf) ? 1 : 0;
        s.flags |= isfinite(v[k]) ? 2 : 0;
      }
      if (v[k] > s.max) { s.max = v[k]; s.argmax = j; }
      if (float_key(v[k]) >= row.kmin && v[k] > m) m = v[k];
    }
    if (!tiles) continue;
    m = warp_max(m);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (float_key(v[k]) >= row.kmin && v[k] > -kInf) sum += __expf((v[k] - m) * row.inv_t);
    sum = warp_sum(sum);
    if (lane == 0) { tile_max[t] = m; tile_sum[t] = sum; }
  }
  return block_row_stats(s, sh);
}

// Rescales tile sums to the global max in place and returns their total S (added in tile order).
__device__ float rescale_tiles(int64_t tiles, float gmax, float inv_t, const float* tile_max, float* tile_sum,
                               BlockScratch& sh) {
  __syncthreads();
  for (int64_t t = threadIdx.x; t < tiles; t += kThreads)
    tile_sum[t] = tile_max[t] > -kInf ? tile_sum[t] * __expf((tile_max[t] - gmax) * inv_t) : 0.f;
  __syncthreads();
  if (threadIdx.x < 32) {
    float acc = 0.f;
    for (int64_t c = 0; c < tiles; c += 32) {
      const float w = c + threadIdx.x < tiles ? tile_sum[c + threadIdx.x] : 0.f;
      acc += warp_sum(w);
    }
    if (threadIdx.x == 0) sh.bcast_f = acc;
  }
  __syncthreads();
  return sh.bcast_f;
}

// --- top-k / top-p thresholds ------------------------------------------------------------------------
// Largest order key k* with W(key >= k*) >= target over the row's ids (keep = key >= k*), where W sums
// w(v) (uint64: counts, or mass in 2^-40 units). `relative`: target = frac · total W (top-p), else frac
// itself (top-k). Returns 0 (keep all) when W never reaches the target. Lanes with equal digits are
// aggregated (match_any + reduce_add) before one shared-memory atomic per group.
template <LogitDType D, typename Wf>
__device__ uint32_t block_radix_threshold(const Row<D>& row, double frac, bool relative, const Wf& w,
                                          BlockScratch& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0, target = 0;
  constexpr int kVec = Row<D>::kVec;  // each thread reads runs of kVec ids (16-byte loads, Row::load_run)
  const int64_t step = static_cast<int64_t>(kThreads) * kVec;
  const int64_t span = (row.vv + step - 1) / step * step;  // whole warps iterate together
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.hist[d] = 0;
    __syncthreads();
    for (int64_t first = static_cast<int64_t>(threadIdx.x) * kVec; first < span; first += step) {
      float run[kVec];
      row.load_run(first, run);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {  // integer histogram: exact whatever the order of the ids
        const uint32_t key = float_key(run[e]);
        const unsigned long long wj = (first + e < row.vv && (key & mask) == prefix) ? w(run[e]) : 0ull;
        const unsigned bin = wj ? (key >> shift) & 255u : 256u + lane;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(wj & 0xFFFFFull));
        const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(wj >> 20));
        if (bin < 256u && lane == __ffs(peers) - 1)
          atomicAdd(&sh.hist[bin], (static_cast<unsigned long long>(hi) << 20) + lo);
      }
    }
    __syncthreads();
    if (warp == 0) {  // lane L owns digits 255 − 8L … 248 − 8L, visited from the top
      unsigned long long group = 0;
      for (int k = 0; k < 8; ++k) group += sh.hist[255 - 8 * lane - k];
      const unsigned long long incl = warp_inclusive_scan(group, lane);
      if (shift == 24) {
        const unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
        target = relative ? static_cast<unsigned long long>(frac * static_cast<double>(total))
                          : static_cast<unsigned long long>(frac);
        target = target ? target : 1ull;
      }
      const unsigned hits = __ballot_sync(0xffffffffu, above + incl >= target);
      const int owner = hits ? __ffs(hits) - 1 : -1;
      if (lane == 0) sh.bcast_j = -1;
      __syncwarp();
      if (lane == owner) {
        unsigned long long a = above + incl - group;
        for (int k = 0; k < 8; ++k) {
          const int d = 255 - 8 * lane - k;
          if (a + sh.hist[d] >= target) { sh.bcast_j = d; break; }
          a += sh.hist[d];
        }
        above = a;
      }
      above = __shfl_sync(0xffffffffu, above, owner < 0 ? 0 : owner);
      target = __shfl_sync(0xffffffffu, target, 0);
    }
    __syncthreads();
    const int digit = static_cast<int>(sh.bcast_j);
    __syncthreads();
    if (digit < 0) return 0u;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// --- emission: inverse-CDF sample of the residual ----------------------------------------------------
// Residual weight of id j (unnormalised, like verify_residual in verify_core.h).
template <LogitDType D>
__device__ __forceinline__ float residual_weight(const Row<D>& row, int64_t j, float S, const float* q,
                                                 int64_t x) {
  if (j >= row.vv) return 0.f;
  const float e = row.weight(row.load(j));
  if (x < 0) return e;
  if (!q) return j == x ? 0.f : e;
  return fmaxf(e - q[j] * S, 0.f);
}

// Residual tile sums of a draft_probs slot into tile_r; returns their ordered total.
template <LogitDType D>
__device__ float residual_tiles(const Row<D>& row, float S, const float* q, int64_t x, float* tile_r,
                                BlockScratch& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = warp; t < row.tiles; t += kWarps) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) sum += residual_weight(row, t * kTile + k * 32 + lane, S, q, x);
    sum = warp_sum(sum);
    if (lane == 0) tile_r[t] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    float acc = 0.f;
    for (int64_t c = 0; c < row.tiles; c += 32) acc += warp_sum(c + lane < row.tiles ? tile_r[c + lane] : 0.f);
    if (lane == 0) sh.bcast_f = acc;
  }
  __syncthreads();
  return sh.bcast_f;
}

// Warp 0: the first id whose cumulative residual weight exceeds target (tiles weighted by tile_w,
// minus `sub` in tile `sub_tile`). Falls back to the last positive id of the chosen tile, then to -1.
template <LogitDType D>
__device__ int64_t warp_inverse_cdf(const Row<D>& row, const float* tile_w, int64_t sub_tile, float sub,
                                    float target, float S, const float* q, int64_t x) {
  const int lane = threadIdx.x & 31;
  float before = 0.f;
  int64_t tile = -1, last_tile = -1;
  for (int64_t c = 0; c < row.tiles && tile < 0; c += 32) {
    const int64_t t = c + lane;
    const float w = t < row.tiles ? tile_w[t] - (t == sub_tile ? sub : 0.f) : 0.f;
    const float incl = warp_inclusive_scan(w, lane);
    const unsigned hits = __ballot_sync(0xffffffffu, before + incl > target && w > 0.f);
    const unsigned pos = __ballot_sync(0xffffffffu, w > 0.f);
    if (pos) last_tile = c + 31 - __clz(pos);
    if (hits) {
      const int first = __ffs(hits) - 1;
      tile = c + first;
      before += __shfl_sync(0xffffffffu, incl - w, first);
    } else {
      before += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  if (tile < 0) tile = last_tile;
  if (tile < 0) return -1;
  int64_t last = -1;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t j = tile * kTile + k * 32 + lane;
    const float r = residual_weight(row, j, S, q, x);
    const float incl = warp_inclusive_scan(r, lane);
    const unsigned hits = __ballot_sync(0xffffffffu, before + incl > target && r > 0.f);
    if (hits) return tile * kTile + k * 32 + __ffs(hits) - 1;
    const unsigned pos = __ballot_sync(0xffffffffu, r > 0.f);
    if (pos) last = tile * kTile + k * 32 + 31 - __clz(pos);
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return last;
}

// Token emitted at a rejected (or draft-less, or bonus) sampling slot. R = 0 falls back to p minus x,
// then to p (status |= kStatusFallback), as in verify_cpu.cpp.
template <LogitDType D>
__device__ int64_t block_emit(const Row<D>& row, float S, const float* q, int64_t x, float ex, double u,
                              const float* tile_sum, float* tile_r, int64_t argmax, int32_t& status,
                              BlockScratch& sh) {
  bool use_q = q && x >= 0;
  float R = use_q ? residual_tiles(row, S, q, x, tile_r, sh) : (x >= 0 ? S - ex : S);
  if (!(R > 0.f)) {
    status |= kStatusFallback;
    if (use_q) {
      use_q = false;
      R = S - ex;
    }
    if (!(R > 0.f)) {
      x = -1;
      R = S;
    }
  }
  if (threadIdx.x < 32) {
    const float target = static_cast<float>(u) * R;
    const int64_t tok = use_q ? warp_inverse_cdf(row, tile_r, -1, 0.f, target, S, q, x)
                              : warp_inverse_cdf(row, tile_sum, x >= 0 ? x / kTile : -1, ex, target, S,
                                                 nullptr, x);
    if (threadIdx.x == 0) sh.bcast_j = tok < 0 ? argmax : tok;
  }
  __syncthreads();
  return sh.bcast_j;
}

// --- kernels -----------------------------------------------------------------------------------------
// One CTA per logits row (b, i): judges slot i of row b and writes pack_slot(candidate, accepted,
// status) into tokens[b, i]. Dynamic shared memory: 3 float arrays of `tiles` entries.
template <LogitDType D>
__global__ void __launch_bounds__(kThreads) verify_slot_kernel(const VerifyParams p) {
  extern __shared__ float tile_mem[];
  __shared__ BlockScratch sh;
  const int64_t b = blockIdx.x / (p.K + 1), i = blockIdx.x % (p.K + 1);
  const bool greedy = verify_is_greedy(p, b);
  const bool topk = !greedy && verify_topk_on(p, b), topp = !greedy && verify_topp_on(p, b);
  Row<D> row;
  row.l = static_cast<const typename Row<D>::T*>(p.logits) + b * p.logits_stride_b + i * p.logits_stride_k;
  row.vv = p.valid_vocab;
  row.tiles = (p.valid_vocab + kTile - 1) / kTile;
  row.max = 0.f;
  row.inv_t = greedy ? 1.f : verify_inv_temperature(verify_temperature(p, b));
  row.kmin = 0u;
  row.vec = (reinterpret_cast<uintptr_t>(row.l) & 15u) == 0;
  float *tile_max = tile_mem, *tile_sum = tile_mem + row.tiles, *tile_r = tile_mem + 2 * row.tiles;

  const RowStats st = sweep_stats(row, !greedy && !topk, tile_max, tile_sum, sh);
  int32_t status = ((st.flags & 1) ? kStatusNonFinite : 0) | ((st.flags & 2) ? 0 : kStatusNoFinite) |
                   verify_input_status(p, b, i);
  const int64_t x = verify_draft(p, b, i);
  int64_t* out = p.tokens + b * (p.K + 1) + i;
  if (status & kStatusErrors) {
    if (threadIdx.x == 0) *out = pack_slot(0, false, status);
    return;
  }
  if (greedy) {
    if (threadIdx.x == 0) *out = pack_slot(st.argmax, x >= 0 && x == st.argmax, status);
    return;
  }
  row.max = st.max;
  if (topk) {
    row.kmin = block_radix_threshold(row, verify_top_k(p, b), false, [](float) { return 1ull; }, sh);
    sweep_stats(row, true, tile_max, tile_sum, sh);
  }
  float S = rescale_tiles(row.tiles, row.max, row.inv_t, tile_max, tile_sum, sh);
  if (topp) {
    const Row<D> r = row;
    const uint32_t pmin = block_radix_threshold(
        row, fmaxf(verify_top_p(p, b), 0.f), true,
        [r](float v) { return static_cast<unsigned long long>(r.weight(v) * kMassScale); }, sh);
    row.kmin = pmin > row.kmin ? pmin : row.kmin;
    sweep_stats(row, true, tile_max, tile_sum, sh);
    S = rescale_tiles(row.tiles, row.max, row.inv_t, tile_max, tile_sum, sh);
  }
  const float* q = verify_draft_q(p, b, i);
  const float ex = x >= 0 ? row.weight(row.load(x)) : 0.f;
  const bool accepted =
      x >= 0 && verify_accept(verify_coin(p, b, i, kStreamAccept), q ? q[x] : 1.0, ex, S);
  int64_t token = x;
  if (!accepted)
    token = block_emit(row, S, q, x, ex, verify_coin(p, b, i, kStreamResample), tile_sum, tile_r, st.argmax,
                       status, sh);
  if (threadIdx.x == 0) *out = pack_slot(token, accepted, status);
}

// One thread per batch row: combine_row (verify_pack.cuh).
__global__ void verify_combine_kernel(const VerifyParams p) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < p.B) combine_row(p, b);
}

// Static shared memory of the slot kernel (BlockScratch and the compiler's own), read once per dtype.
template <LogitDType D>
size_t slot_kernel_static_smem() {
  static const size_t bytes = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, verify_slot_kernel<D>) == cudaSuccess ? attr.sharedSizeBytes
                                                                               : sizeof(BlockScratch);
  }();
  return bytes;
}

template <LogitDType D>
void launch(const VerifyParams& p, cudaStream_t stream) {
  static_assert(kTile == kVerifyTileIds, "verify_smem.h sizes the tiles of this kernel");
  const size_t smem = verify_dynamic_smem_bytes(p.valid_vocab);
  if (verify_needs_smem_optin(smem, slot_kernel_static_smem<D>()))
    cudaFuncSetAttribute(verify_slot_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  verify_slot_kernel<D><<<static_cast<unsigned>(p.B * (p.K + 1)), kThreads, smem, stream>>>(p);
  verify_combine_kernel<<<static_cast<unsigned>((p.B + 127) / 128), 128, 0, stream>>>(p);
}

}  // namespace

int64_t verify_cuda_max_vocab() { return verify_max_vocab(); }

void verify_cuda_launch(const VerifyParams& p, cudaStream_t stream) {
  switch (p.logits_dtype) {
    case LogitDType::kF32: launch<LogitDType::kF32>(p, stream); break;
    case LogitDType::kF16: launch<LogitDType::kF16>(p, stream); break;
    case LogitDType::kBF16: launch<LogitDType::kBF16>(p, stream); break;
  }
}

}  // namespace flashmap

// verify v2 — CUDA kernel in the slice decomposition of verify_slices.h (CPU twin: verify_cpu_sliced.h;
// shared rules: verify_core.h; reference: flashmap_ext/ops/verify_reference.py). Selected by
// FLASHMAP_VERIFY_KERNEL=v2 (verify_glue.h); the default is verify_kernel.cu.
//
// One launch. A logits row (b, i) is judged by a cluster of C CTAs of kVerifyLanes threads (C = 8, 4, 2 or
// 1: verify_cluster_size); CTA rank r owns slices r, r + C, ... The lean pass streams a slice once with
// 32-bit chunk indices, kUnroll 16-byte loads in flight per lane, the chunk max from packed bf16x2 / f16x2
// NaN-propagating max, the per-lane online Σ 2^((v − m)·c) rescaled only when a chunk max rises, and the
// argmax found afterwards from the chunk where the lane's max rose (greedy rows keep only the max). NaN and
// +inf show up in the max itself; only then is the slice re-scanned for the exact status bits. The lanes
// reduce in the fixed tree, each CTA writes its slices' records to shared memory, and after a cluster
// barrier every CTA merges the 8 records in slice order through distributed shared memory: every CTA of
// the row then holds the same max, Σ, argmax and per-slice sums. Top-k / top-p: radix selections whose
// 256-bin histograms are built per CTA over its slices (kept in shared memory when verify_resident_bytes
// allows) and summed over the cluster, then a filtered pass. The accept test needs one logit; a rejected
// slot picks the slice of its residual sample from the per-slice masses and the owner of that slice finds
// the id. The slot's packed word goes to tokens[b, i]; the last of a batch row's K+1 slots to finish
// (an arrival counter per batch row, reset by that slot) combines the row (verify_pack.cuh). CUDA-graph
// safe: no host sync, no allocation, counters zero on entry and left zero.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "verify/verify_core.h"
#include "verify/verify_launch.h"
#include "verify/verify_pack.cuh"
#include "verify/verify_slices.h"

namespace flashmap {
namespace {

namespace cg = cooperative_groups;
constexpr int kThreads = kVerifyLanes;
constexpr int kUnroll = 8;        // chunks a lane loads before it uses the first
constexpr int kMinCtasPerSm = 2;  // register bound: 128 per thread, 2 CTAs (512 threads) per SM
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed point of the top-p mass histogram

__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
struct Ex2 {
  __device__ float operator()(float x) const { return ex2(x); }
};

// --- chunks: 8 ids as raw words ------------------------------------------------------------------------
template <LogitDType D>
struct Chunk {  // bf16 / fp16: one 16-byte vector
  using T = uint16_t;
  static constexpr int kVecs = 1;
  uint4 w[1];
  static __device__ uint16_t neg_inf() { return D == LogitDType::kBF16 ? 0xFF80u : 0xFC00u; }
  __device__ float max() const {
    if constexpr (D == LogitDType::kBF16) {
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(w);
      const __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(h[0], h[1]), __hmax2_nan(h[2], h[3]));
      return verify_max_nan(__low2float(m), __high2float(m));
    } else {
      const auto* h = reinterpret_cast<const __half2*>(w);
      const __half2 m = __hmax2_nan(__hmax2_nan(h[0], h[1]), __hmax2_nan(h[2], h[3]));
      return verify_max_nan(__low2float(m), __high2float(m));
    }
  }
  __device__ void unpack(float (&v)[kVerifyChunk]) const {
    const uint32_t u[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (D == LogitDType::kBF16) {
        v[2 * k] = __uint_as_float(u[k] << 16);
        v[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[k]));
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
      }
    }
  }
  __device__ void set(int k, const T* l, int64_t j, bool valid) {
    reinterpret_cast<uint16_t*>(w)[k] = valid ? l[j] : neg_inf();
  }
};
template <>
struct Chunk<LogitDType::kF32> {  // two 16-byte vectors
  using T = float;
  static constexpr int kVecs = 2;
  uint4 w[2];
  __device__ float max() const {
    float v[kVerifyChunk];
    unpack(v);
    return verify_max_nan(verify_max_nan(verify_max_nan(v[0], v[1]), verify_max_nan(v[2], v[3])),
                          verify_max_nan(verify_max_nan(v[4], v[5]), verify_max_nan(v[6], v[7])));
  }
  __device__ void unpack(float (&v)[kVerifyChunk]) const {
    const float* f = reinterpret_cast<const float*>(w);
#pragma unroll
    for (int k = 0; k < kVerifyChunk; ++k) v[k] = f[k];
  }
  __device__ void set(int k, const T* l, int64_t j, bool valid) {
    reinterpret_cast<float*>(w)[k] = valid ? l[j] : -kVerifyInf;
  }
};

// One logits row and where its chunks come from: global memory (16-byte vectors when the row is aligned,
// else scalar loads) or, for the filter passes, this CTA's resident copy of its slice.
template <LogitDType D>
struct Row {
  using T = typename Chunk<D>::T;
  const T* l;
  const uint4* vec;     // l as 16-byte vectors, or nullptr (unaligned row: scalar loads)
  int32_t vv, full;     // valid ids; chunks whose 8 ids are all valid
  uint4* resident;      // shared-memory copy of the CTA's slice (chunk ci at ci - resident_begin), or nullptr
  int32_t resident_begin;
  float c;              // log2(e) / T
  float M;              // row max (after pass 1)
  uint32_t kmin;        // filter: keep ids with float_key(v) >= kmin

  __device__ Chunk<D> global_chunk(int32_t ci) const {
    Chunk<D> ch;
    if (vec && ci < full) {
#pragma unroll
      for (int q = 0; q < Chunk<D>::kVecs; ++q) ch.w[q] = __ldg(vec + ci * Chunk<D>::kVecs + q);
    } else {
#pragma unroll
      for (int k = 0; k < kVerifyChunk; ++k) {
        const int32_t j = ci * kVerifyChunk + k;
        ch.set(k, l, j, j < vv);
      }
    }
    return ch;
  }
  __device__ Chunk<D> chunk(int32_t ci) const {
    if (!resident) return global_chunk(ci);
    Chunk<D> ch;
#pragma unroll
    for (int q = 0; q < Chunk<D>::kVecs; ++q) ch.w[q] = resident[(ci - resident_begin) * Chunk<D>::kVecs + q];
    return ch;
  }
  __device__ float logit(int64_t j) const { return LogitLoad<D>::load(l, j); }
  __device__ float weight(float v) const { return float_key(v) >= kmin ? ex2(verify_mul(v - M, c)) : 0.f; }
};

// --- block-wide fixed trees (verify_slices.h: verify_tree_reduce, verify_lane_scan) --------------------
__device__ __forceinline__ SliceStat shfl_xor(const SliceStat& v, int o) {
  return SliceStat{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o),
                   __shfl_xor_sync(0xffffffffu, v.arg, o)};
}
__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }

// Shared-memory storage for N values of T (SliceStat has default member initialisers, which __shared__
// variables may not have).
template <typename T, int N>
struct Raw {
  alignas(T) unsigned char bytes[sizeof(T) * N];
  __device__ T* get() { return reinterpret_cast<T*>(bytes); }
};

// verify_tree_reduce as butterflies: at each step lane l combines (lower lane, higher lane) of (l, l ^ o).
template <typename T, typename Comb>
__device__ T block_tree(T v, const Comb& comb, T* warp_buf) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const T other = shfl_xor(v, o);
    v = (lane & o) ? comb(other, v) : comb(v, other);
  }
  if (lane == 0) warp_buf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_buf[lane < kVerifyWarpCount ? lane : 0];
#pragma unroll
    for (int o = kVerifyWarpCount / 2; o; o >>= 1) {
      const T other = shfl_xor(v, o);
      v = (lane & o) ? comb(other, v) : comb(v, other);
    }
    if (lane == 0) warp_buf[0] = v;
  }
  __syncthreads();
  v = warp_buf[0];
  __syncthreads();
  return v;
}

// verify_lane_scan: inclusive Σ over the lanes in the fixed Kogge-Stone order.
__device__ float block_scan(float v, float* warp_buf) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = verify_add(v, n);
  }
  if (lane == 31) warp_buf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < kVerifyWarpCount ? warp_buf[lane] : 0.f;
#pragma unroll
    for (int o = 1; o < kVerifyWarpCount; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t = verify_add(t, n);
    }
    if (lane < kVerifyWarpCount) warp_buf[lane] = t;
  }
  __syncthreads();
  if (warp > 0) v = verify_add(v, warp_buf[warp - 1]);
  __syncthreads();
  return v;
}

// --- shared memory and the cluster ---------------------------------------------------------------------
struct Shared {
  Raw<SliceStat, kVerifySlices> rec;  // this CTA's slices' records (read by the cluster)
  float sum[kVerifySlices];        // this CTA's slices' Σ of the filtered / residual passes (read by the cluster)
  int32_t flags[kVerifySlices];    // per slice: 1 NaN/+inf seen, 2 a finite value seen (read by the cluster)
  unsigned long long hist[256];    // this CTA's radix histogram (read by the cluster)
  unsigned long long tot[256];     // the cluster's histogram
  Raw<SliceStat, kVerifyWarpCount> tree_stat;
  float tree_f[kVerifyWarpCount];
  float scan[kVerifyWarpCount];
  Raw<SliceStat, 1> row_raw;
  float slice[kVerifySlices];      // per-slice Σ relative to the row max (every slice, after the merge)
  int32_t status, pick_lane, last_lane, token;
  int digit;
};

template <int C>
__device__ __forceinline__ void cluster_barrier() {
  if constexpr (C > 1) {
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}
// Element s of a per-slice array of the CTA owning slice s (rank s % C).
template <int C, typename T>
__device__ __forceinline__ T from_owner(T* local, int s) {
  if constexpr (C > 1) {
    return *cg::this_cluster().map_shared_rank(local + s, s % C);
  } else {
    return local[s];
  }
}

// --- passes over one slice -------------------------------------------------------------------------------
// The rare path of the hot loop, out of line: a chunk max at or above the lane's max.
__device__ __noinline__ LaneStat lane_raise(LaneStat st, float cm, int32_t chunk, float c) {
  verify_lane_raise(st, cm, chunk, c, Ex2{});
  return st;
}

template <LogitDType D, bool kSum>
__device__ __forceinline__ void lane_chunk(LaneStat& st, const Chunk<D>& ch, int32_t ci, float c) {
  float v[kVerifyChunk];
  if constexpr (kSum) ch.unpack(v);
  verify_lane_push<kSum>(st, v, ch.max(), ci, c, Ex2{},
                         [c](LaneStat& s, float cm, int32_t chunk) { s = lane_raise(s, cm, chunk, c); });
}

// Pass 1 over slice s: lane statistics (Σ with kSum), the lazy argmax, the tree; the record and flags
// into sh. With `keep`, the chunks are copied into the CTA's resident slice. The lanes' full groups of
// kUnroll chunks are 16-byte loads issued together, unguarded; the rest goes one chunk at a time.
template <LogitDType D, bool kSum>
__device__ __noinline__ void slice_pass(const Row<D> row, int s, uint4* keep, Shared& sh) {
  const SliceRange r = verify_slice_range(row.vv, s);
  const int32_t begin = static_cast<int32_t>(r.begin), end = static_cast<int32_t>(r.end);
  const int32_t vend = row.vec ? (end < row.full ? end : row.full) : begin;  // chunks read as vectors
  constexpr int kV = Chunk<D>::kVecs;
  LaneStat st;
  int32_t ci = begin + static_cast<int32_t>(threadIdx.x);
  for (; ci + (kUnroll - 1) * kThreads < vend; ci += kUnroll * kThreads) {
    Chunk<D> ch[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int q = 0; q < kV; ++q) ch[u].w[q] = __ldg(row.vec + (ci + u * kThreads) * kV + q);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (keep) {
#pragma unroll
        for (int q = 0; q < kV; ++q) keep[(ci + u * kThreads - begin) * kV + q] = ch[u].w[q];
      }
      lane_chunk<D, kSum>(st, ch[u], ci + u * kThreads, row.c);
    }
  }
  for (; ci < end; ci += kThreads) {
    const Chunk<D> ch = row.global_chunk(ci);
    if (keep) {
#pragma unroll
      for (int q = 0; q < kV; ++q) keep[(ci - begin) * kV + q] = ch.w[q];
    }
    lane_chunk<D, kSum>(st, ch, ci, row.c);
  }
  int32_t arg = kVerifyNoId;
  if (st.chunk >= 0) {
    float v[kVerifyChunk];
    row.global_chunk(st.chunk).unpack(v);
#pragma unroll
    for (int k = kVerifyChunk - 1; k >= 0; --k)
      if (v[k] == st.m) arg = st.chunk * kVerifyChunk + k;
  }
  const SliceStat rec = block_tree(SliceStat{st.m, st.s, arg},
                                   [c = row.c](const SliceStat& a, const SliceStat& b) {
                                     return verify_combine(a, b, c, Ex2{});
                                   },
                                   sh.tree_stat.get());
  // Flags from the max; the exact scan only when it is NaN or +inf (an error row).
  int32_t flags = rec.m > -kVerifyInf && rec.m < kVerifyInf ? 2 : 0;
  if (rec.m != rec.m || rec.m == kVerifyInf) {
    int bad = 0, finite = 0;
    for (int64_t j = r.begin * kVerifyChunk + threadIdx.x; j < r.end * kVerifyChunk && j < row.vv; j += kThreads) {
      const float v = row.logit(j);
      bad |= isnan(v) || v == kVerifyInf;
      finite |= isfinite(v);
    }
    flags = (__syncthreads_or(bad) ? 1 : 0) | (__syncthreads_or(finite) ? 2 : 0);
  }
  if (threadIdx.x == 0) {
    sh.rec.get()[s] = rec;
    sh.flags[s] = flags;
  }
}

// Σ over slice s of w(j, v) in the pass order (lanes over interleaved chunks, then the tree) into sh.sum[s].
template <LogitDType D, typename Wf>
__device__ __noinline__ void slice_sum(const Row<D> row, int s, const Wf w, Shared& sh) {
  const SliceRange r = verify_slice_range(row.vv, s);
  float acc = 0.f;
  for (int32_t ci = static_cast<int32_t>(r.begin + threadIdx.x); ci < r.end; ci += kThreads) {
    float v[kVerifyChunk], t[kVerifyChunk];
    row.chunk(ci).unpack(v);
#pragma unroll
    for (int k = 0; k < kVerifyChunk; ++k) t[k] = w(ci * kVerifyChunk + k, v[k]);
    acc = verify_add(acc, verify_chunk_sum(t));
  }
  const float total = block_tree(acc, [](float a, float b) { return verify_add(a, b); }, sh.tree_f);
  if (threadIdx.x == 0) sh.sum[s] = total;
}

// --- top-k / top-p threshold over the cluster ----------------------------------------------------------
// As block_radix_threshold of verify_kernel.cu, with each CTA's histogram over its slices summed over the
// cluster (integers: exact in any order). Every CTA returns the same key; 0 keeps all.
template <int C, LogitDType D, typename Wf>
__device__ __noinline__ uint32_t cluster_threshold(const Row<D> row, int rank, double frac, bool relative,
                                                   const Wf w, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0, target = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.hist[d] = 0;
    __syncthreads();
    for (int s = rank; s < kVerifySlices; s += C) {
      const SliceRange r = verify_slice_range(row.vv, s);
      for (int32_t base = static_cast<int32_t>(r.begin) + warp * 32; base < r.end; base += kThreads) {
        const int32_t ci = base + lane;  // whole warps iterate together (match_any below)
        float v[kVerifyChunk] = {};
        if (ci < r.end) row.chunk(ci).unpack(v);
#pragma unroll
        for (int k = 0; k < kVerifyChunk; ++k) {
          const uint32_t key = float_key(v[k]);
          const unsigned long long wj =
              (ci < r.end && ci * kVerifyChunk + k < row.vv && (key & mask) == prefix) ? w(v[k]) : 0ull;
          const unsigned bin = wj ? (key >> shift) & 255u : 256u + lane;
          const unsigned peers = __match_any_sync(0xffffffffu, bin);
          const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(wj & 0xFFFFFull));
          const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(wj >> 20));
          if (bin < 256u && lane == __ffs(peers) - 1)
            atomicAdd(&sh.hist[bin], (static_cast<unsigned long long>(hi) << 20) + lo);
        }
      }
    }
    cluster_barrier<C>();  // every CTA's histogram is complete
    if (warp == 0) {       // lane L owns digits 255 − 8L … 248 − 8L, visited from the top
      unsigned long long group = 0;
      for (int k = 0; k < 8; ++k) {
        const int d = 255 - 8 * lane - k;
        unsigned long long t = 0;
        for (int q = 0; q < C; ++q) {
          if constexpr (C > 1) {
            t += *cg::this_cluster().map_shared_rank(&sh.hist[d], q);
          } else {
            t += sh.hist[d];
          }
        }
        sh.tot[d] = t;
        group += t;
      }
      unsigned long long incl = group;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      if (shift == 24) {
        const unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
        target = relative ? static_cast<unsigned long long>(frac * static_cast<double>(total))
                          : static_cast<unsigned long long>(frac);
        target = target ? target : 1ull;
      }
      const unsigned hits = __ballot_sync(0xffffffffu, above + incl >= target);
      const int owner = hits ? __ffs(hits) - 1 : -1;
      if (lane == 0) sh.digit = -1;
      __syncwarp();
      if (lane == owner) {
        unsigned long long a = above + incl - group;
        for (int k = 0; k < 8; ++k) {
          const int d = 255 - 8 * lane - k;
          if (a + sh.tot[d] >= target) {
            sh.digit = d;
            break;
          }
          a += sh.tot[d];
        }
        above = a;
      }
      above = __shfl_sync(0xffffffffu, above, owner < 0 ? 0 : owner);
      target = __shfl_sync(0xffffffffu, target, 0);
    }
    cluster_barrier<C>();  // the remote histograms are read before the next round clears them
    const int digit = sh.digit;
    __syncthreads();
    if (digit < 0) return 0u;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// --- emission ------------------------------------------------------------------------------------------
// The owner of slice s: verify_cpu_sliced.h::slice_pick (lanes over contiguous spans, the fixed scan, one
// lane's ordered walk). Returns the id (every thread), or -1.
template <LogitDType D, typename Wf>
__device__ __noinline__ int32_t slice_pick(const Row<D> row, int s, float target, const Wf w, Shared& sh) {
  const SliceRange r = verify_slice_range(row.vv, s);
  const int64_t span = verify_lane_span(row.vv);
  int64_t b = r.begin + threadIdx.x * span < r.end ? r.begin + threadIdx.x * span : r.end;
  int64_t e = b + span < r.end ? b + span : r.end;
  b *= kVerifyChunk;
  e = e * kVerifyChunk < row.vv ? e * kVerifyChunk : row.vv;
  float sum = 0.f;
  for (int32_t j = static_cast<int32_t>(b); j < e; ++j) sum = verify_add(sum, w(j));
  const float incl = block_scan(sum, sh.scan);
  if (threadIdx.x == 0) {
    sh.pick_lane = kThreads;
    sh.last_lane = -1;
  }
  __syncthreads();
  if (sum > 0.f) {
    atomicMax(&sh.last_lane, static_cast<int32_t>(threadIdx.x));
    if (incl > target) atomicMin(&sh.pick_lane, static_cast<int32_t>(threadIdx.x));
  }
  __syncthreads();
  const bool hit = sh.pick_lane < kThreads;
  const int chosen = hit ? sh.pick_lane : sh.last_lane;
  if (threadIdx.x == 0) sh.token = -1;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) == chosen) {
    float cum = incl - sum;
    int32_t pos = -1;
    for (int32_t j = static_cast<int32_t>(b); j < e; ++j) {
      const float x = w(j);
      if (!(x > 0.f)) continue;
      cum = verify_add(cum, x);
      pos = j;
      if (hit && cum > target) break;
    }
    sh.token = pos;
  }
  __syncthreads();
  return sh.token;
}

// --- after pass 1 --------------------------------------------------------------------------------------
// Thread 0: the 8 slice records merged in slice order (read from their owners), the per-slice Σ rescaled
// to the row max, the status bits.
template <int C>
__device__ __noinline__ void merge_records(const VerifyParams& p, int64_t b, int64_t i, float c, Shared& sh) {
  SliceStat recs[kVerifySlices];
  int32_t flags = 0;
  for (int s = 0; s < kVerifySlices; ++s) {
    recs[s] = from_owner<C>(sh.rec.get(), s);
    flags |= from_owner<C>(sh.flags, s);
  }
  SliceStat acc = recs[0];
  for (int s = 1; s < kVerifySlices; ++s) acc = verify_combine(acc, recs[s], c, Ex2{});
  for (int s = 0; s < kVerifySlices; ++s) sh.slice[s] = verify_rescaled(recs[s], acc.m, c, Ex2{});
  *sh.row_raw.get() = acc;
  sh.status = ((flags & 1) ? kStatusNonFinite : 0) | ((flags & 2) ? 0 : kStatusNoFinite) |
              verify_input_status(p, b, i);
}

// A sampling row's Σ under its top-k / top-p filter: the thresholds over the cluster, then the filtered
// pass per slice; sh.slice and the row's Σ replaced. Returns the row with its filter set.
template <int C, LogitDType D>
__device__ __noinline__ Row<D> filtered_sums(Row<D> row, const VerifyParams& p, int64_t b, int rank, bool topk,
                                             bool topp, Shared& sh) {
  if (topk) row.kmin = cluster_threshold<C>(row, rank, verify_top_k(p, b), false, [](float) { return 1ull; }, sh);
  if (topp) {
    const Row<D> r0 = row;
    const uint32_t pmin = cluster_threshold<C>(row, rank, fmaxf(verify_top_p(p, b), 0.f), true, [r0](float v) {
      return static_cast<unsigned long long>(static_cast<double>(r0.weight(v)) * kMassScale);
    }, sh);
    row.kmin = pmin > row.kmin ? pmin : row.kmin;
  }
  for (int s = rank; s < kVerifySlices; s += C)
    slice_sum(row, s, [row](int64_t, float v) { return row.weight(v); }, sh);
  cluster_barrier<C>();
  if (threadIdx.x == 0) {
    float acc = 0.f;
    for (int s = 0; s < kVerifySlices; ++s) {
      sh.slice[s] = from_owner<C>(sh.sum, s);
      acc = s ? verify_add(acc, sh.slice[s]) : sh.slice[s];
    }
    sh.row_raw.get()->s = acc;
  }
  cluster_barrier<C>();  // sh.sum is read before a residual pass reuses it
  return row;
}

// The residual weight of id j with value v: max(e − q·S, 0) for draft_probs, else e with x removed.
template <LogitDType D>
struct Residual {
  Row<D> row;
  const float* q;  // nullptr: point mass
  int64_t x;
  float S;
  __device__ float operator()(int64_t j, float v) const {
    if (q) {
      const float d = verify_add(row.weight(v), -verify_mul(q[j], S));
      return d > 0.f ? d : 0.f;
    }
    return j == x ? 0.f : row.weight(v);
  }
  __device__ float operator()(int64_t j) const { return (*this)(j, row.logit(j)); }
};

// Rejected (or draft-less, or bonus) sampling slot: the residual mass per slice, the fallbacks, the slice
// holding u·R, and its owner's slice_pick (verify_cpu_sliced.h::emit). Returns the token (on the writer
// rank) and sets the writer rank and the fallback bit.
template <int C, LogitDType D>
__device__ __noinline__ int64_t emit(const Row<D> row, const VerifyParams& p, int64_t b, int64_t i, int rank,
                                     float S, float ex, int& writer, int32_t& status, Shared& sh) {
  const int64_t x = verify_draft(p, b, i);
  Residual<D> res{row, verify_draft_q(p, b, i), x, S};
  if (!(res.q && x >= 0)) res.q = nullptr;
  if (res.q) {
    for (int s = rank; s < kVerifySlices; s += C) slice_sum(row, s, res, sh);
    cluster_barrier<C>();
  }
  float R[kVerifySlices];
  const int64_t per = verify_slice_chunks(row.vv);
  auto point_mass = [&](int64_t xx) {
    for (int s = 0; s < kVerifySlices; ++s) {
      const float d = xx >= 0 && xx / kVerifyChunk / per == s ? verify_add(sh.slice[s], -ex) : sh.slice[s];
      R[s] = d > 0.f ? d : 0.f;
    }
  };
  auto total = [&R] {
    float t = R[0];
    for (int s = 1; s < kVerifySlices; ++s) t = verify_add(t, R[s]);
    return t;
  };
  if (res.q) {
    for (int s = 0; s < kVerifySlices; ++s) R[s] = from_owner<C>(sh.sum, s);
  } else {
    point_mass(res.x);
  }
  float tot = total();
  if (!(tot > 0.f)) {
    status |= kStatusFallback;
    if (res.q) {
      res.q = nullptr;
      point_mass(res.x);
      tot = total();
    }
    if (!(tot > 0.f)) {
      res.x = -1;
      point_mass(res.x);
      tot = total();
    }
  }
  const float target = verify_mul(static_cast<float>(verify_coin(p, b, i, kStreamResample)), tot);
  float cum = 0.f, before = 0.f;
  int pick = -1, last = -1;
  for (int s = 0; s < kVerifySlices && pick < 0; ++s) {
    if (!(R[s] > 0.f)) continue;
    const float next = verify_add(cum, R[s]);
    if (next > target) {
      pick = s;
      before = cum;
    }
    cum = next;
    last = s;
  }
  const int s = pick >= 0 ? pick : last;
  int64_t token = sh.row_raw.get()->arg;
  if (s >= 0) {
    writer = s % C;
    if (rank == writer) {
      const int32_t tok = slice_pick(row, s, pick >= 0 ? target - before : kVerifyInf, res, sh);
      if (tok >= 0) token = tok;
    }
  }
  return token;
}

// --- the kernel ----------------------------------------------------------------------------------------
template <LogitDType D, int C>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) verify_v2_kernel(const VerifyParams p, int* counters, int resident) {
  extern __shared__ uint4 keep_mem[];
  __shared__ Shared sh;
  const int rank = C > 1 ? static_cast<int>(blockIdx.x % C) : 0;
  const int64_t rowid = blockIdx.x / C, b = rowid / (p.K + 1), i = rowid % (p.K + 1);
  const bool greedy = verify_is_greedy(p, b);
  const bool topk = !greedy && verify_topk_on(p, b), topp = !greedy && verify_topp_on(p, b);
  const bool online = !greedy && !topk && !topp;
  Row<D> row;
  row.l = static_cast<const typename Row<D>::T*>(p.logits) + b * p.logits_stride_b + i * p.logits_stride_k;
  row.vec = (reinterpret_cast<uintptr_t>(row.l) & 15u) == 0 ? reinterpret_cast<const uint4*>(row.l) : nullptr;
  row.vv = static_cast<int32_t>(p.valid_vocab);
  row.full = row.vv / kVerifyChunk;
  row.resident = nullptr;
  row.resident_begin = 0;
  row.c = greedy ? 1.f : verify_exp2_scale(verify_temperature(p, b));
  row.M = 0.f;
  row.kmin = 0u;
  uint4* keep = resident && !online && !greedy ? keep_mem : nullptr;  // one slice per CTA (C == 8)

  for (int s = rank; s < kVerifySlices; s += C) {  // pass 1 over this CTA's slices
    if (online) {
      slice_pass<D, true>(row, s, nullptr, sh);
    } else {
      slice_pass<D, false>(row, s, keep, sh);
    }
  }
  cluster_barrier<C>();
  if (threadIdx.x == 0) merge_records<C>(p, b, i, row.c, sh);
  __syncthreads();
  int32_t status = sh.status;
  const int64_t x = verify_draft(p, b, i);
  int64_t token = 0;
  bool accepted = false;
  int writer = 0;
  row.M = sh.row_raw.get()->m;
  if (!(status & kStatusErrors) && greedy) {
    token = sh.row_raw.get()->arg;
    accepted = x >= 0 && x == token;
  } else if (!(status & kStatusErrors)) {
    if (!online) {
      if (keep) {
        row.resident = keep;
        row.resident_begin = static_cast<int32_t>(verify_slice_range(row.vv, rank).begin);
      }
      row = filtered_sums<C>(row, p, b, rank, topk, topp, sh);
    }
    const float S = sh.row_raw.get()->s;
    const float* q = verify_draft_q(p, b, i);
    const float ex = x >= 0 ? row.weight(row.logit(x)) : 0.f;
    accepted = x >= 0 && verify_accept(verify_coin(p, b, i, kStreamAccept), q ? q[x] : 1.0, ex, S);
    token = accepted ? x : emit<C>(row, p, b, i, rank, S, ex, writer, status, sh);
  }
  // The writer publishes the slot; the last slot of batch row b to arrive combines the row.
  if (rank == writer && threadIdx.x == 0) {
    p.tokens[b * (p.K + 1) + i] = pack_slot(token, accepted, status);
    __threadfence();
    if (atomicAdd(&counters[b], 1) == p.K) {
      __threadfence();
      combine_row(p, b);
      counters[b] = 0;
    }
  }
  cluster_barrier<C>();  // no CTA leaves while the cluster may still read its shared memory
}

// --- launch --------------------------------------------------------------------------------------------
template <LogitDType D>
constexpr int elem_bytes() {
  return D == LogitDType::kF32 ? 4 : 2;
}

template <LogitDType D, int C>
cudaLaunchConfig_t launch_config(const VerifyParams& p, size_t smem, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.B * (p.K + 1) * C));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = C;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = C > 1 ? 1 : 0;
  return cfg;
}

template <LogitDType D, int C>
size_t smem_bytes(const VerifyParams& p) {
  const size_t smem = static_cast<size_t>(verify_resident_bytes(p.valid_vocab, C, elem_bytes<D>()));
  if (smem > 48 * 1024)
    (void)cudaFuncSetAttribute(verify_v2_kernel<D, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
  return smem;
}

// How many clusters of C CTAs fit on the GPU at once (C = 1: CTAs).
template <LogitDType D, int C>
int64_t resident_clusters(const VerifyParams& p, cudaStream_t stream) {
  const size_t smem = smem_bytes<D, C>(p);
  if constexpr (C == 1) {
    int device = 0, sms = 0, per_sm = 0;
    (void)cudaGetDevice(&device);
    (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, verify_v2_kernel<D, 1>, kThreads, smem);
    return static_cast<int64_t>(sms) * per_sm;
  } else {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config<D, C>(p, smem, stream, &attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, verify_v2_kernel<D, C>, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return clusters;
  }
}

template <LogitDType D, int C>
cudaError_t launch_cluster(const VerifyParams& p, int* counters, cudaStream_t stream) {
  const size_t smem = smem_bytes<D, C>(p);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config<D, C>(p, smem, stream, &attr);
  return cudaLaunchKernelEx(&cfg, verify_v2_kernel<D, C>, p, counters, smem > 0 ? 1 : 0);
}

// Occupancy of each cluster size, queried once per (device, valid_vocab) (it depends on the shared memory).
template <LogitDType D>
std::array<int64_t, 4> resident_by_cluster(const VerifyParams& p, cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, std::array<int64_t, 4>> cache;
  int device = 0;
  (void)cudaGetDevice(&device);
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, p.valid_vocab);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, std::array<int64_t, 4>{resident_clusters<D, 1>(p, stream), resident_clusters<D, 2>(p, stream),
                                                   resident_clusters<D, 4>(p, stream),
                                                   resident_clusters<D, 8>(p, stream)}).first;
  }
  return it->second;
}

template <LogitDType D>
cudaError_t launch_v2(const VerifyParams& p, int* counters, cudaStream_t stream) {
  const std::array<int64_t, 4> r = resident_by_cluster<D>(p, stream);
  const int64_t resident[4] = {r[0], r[1], r[2], r[3]};
  switch (verify_cluster_size(p.B * (p.K + 1), resident)) {
    case 8: return launch_cluster<D, 8>(p, counters, stream);
    case 4: return launch_cluster<D, 4>(p, counters, stream);
    case 2: return launch_cluster<D, 2>(p, counters, stream);
    default: return launch_cluster<D, 1>(p, counters, stream);
  }
}

}  // namespace

cudaError_t verify_v2_cuda_launch(const VerifyParams& p, int* counters, cudaStream_t stream) {
  switch (p.logits_dtype) {
    case LogitDType::kF32: return launch_v2<LogitDType::kF32>(p, counters, stream);
    case LogitDType::kF16: return launch_v2<LogitDType::kF16>(p, counters, stream);
    case LogitDType::kBF16: return launch_v2<LogitDType::kBF16>(p, counters, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace flashmap

// CPU twin of the v2 CUDA verify kernel (verify_v2_kernel.cu): one slot judged by one thread, in the
// slice decomposition of verify_slices.h — the same lanes, chunk order, online rescaling, reduction tree,
// slice merge order, fixed-point top-p histogram and emission scan — so that the kernel's reduction order
// runs and is tested against the float64 reference on a CPU (python_tests/verify/test_verify_v2.py). Only
// 2^x differs (std::exp2 here, ex2.approx there). Selected by FLASHMAP_VERIFY_KERNEL=v2 (verify_glue.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "verify/verify_cpu_loops.h"
#include "verify/verify_slices.h"

namespace flashmap {
namespace cpu {
namespace sliced {

struct Exp2 {
  float operator()(float x) const { return std::exp2(x); }
};
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed-point unit of the top-p mass histogram

// The 8 values of chunk ci (−inf past the valid ids) and their NaN-propagating max.
template <LogitDType D>
float load_chunk(Ptr<D> l, int64_t vv, int64_t ci, float (&v)[kVerifyChunk]) {
  for (int k = 0; k < kVerifyChunk; ++k) {
    const int64_t j = ci * kVerifyChunk + k;
    v[k] = j < vv ? LogitLoad<D>::load(l, j) : -kVerifyInf;
  }
  return verify_max_nan(verify_max_nan(verify_max_nan(v[0], v[1]), verify_max_nan(v[2], v[3])),
                        verify_max_nan(verify_max_nan(v[4], v[5]), verify_max_nan(v[6], v[7])));
}

// Lowest id of chunk ci holding m (the lazy argmax), else kVerifyNoId.
template <LogitDType D>
int32_t chunk_argmax(Ptr<D> l, int64_t vv, int32_t ci, float m) {
  if (ci < 0) return kVerifyNoId;
  float v[kVerifyChunk];
  load_chunk<D>(l, vv, ci, v);
  for (int k = 0; k < kVerifyChunk; ++k)
    if (v[k] == m) return ci * kVerifyChunk + k;
  return kVerifyNoId;
}

// Pass over slice s: per-lane online statistics, reduced by the tree. kSum: with Σ (sampling rows).
template <LogitDType D, bool kSum>
SliceStat slice_stats(Ptr<D> l, int64_t vv, int s, float c) {
  const SliceRange r = verify_slice_range(vv, s);
  LaneStat lane[kVerifyLanes];
  for (int64_t ci = r.begin; ci < r.end; ++ci) {
    float v[kVerifyChunk];
    const float cm = load_chunk<D>(l, vv, ci, v);
    verify_lane_push<kSum>(lane[(ci - r.begin) % kVerifyLanes], v, cm, static_cast<int32_t>(ci), c, Exp2{},
                           [c](LaneStat& st, float m, int32_t chunk) { verify_lane_raise(st, m, chunk, c, Exp2{}); });
  }
  SliceStat st[kVerifyLanes];
  for (int t = 0; t < kVerifyLanes; ++t)
    st[t] = SliceStat{lane[t].m, lane[t].s, chunk_argmax<D>(l, vv, lane[t].chunk, lane[t].m)};
  return verify_tree_reduce(st, [c](const SliceStat& a, const SliceStat& b) {
    return verify_combine(a, b, c, Exp2{});
  });
}

// Σ over slice s of w(j, value) in the pass order (lanes over interleaved chunks, then the tree).
template <LogitDType D, typename Wf>
float slice_sum(Ptr<D> l, int64_t vv, int s, const Wf& w) {
  const SliceRange r = verify_slice_range(vv, s);
  float lane[kVerifyLanes] = {};
  for (int64_t ci = r.begin; ci < r.end; ++ci) {
    float v[kVerifyChunk], t[kVerifyChunk];
    load_chunk<D>(l, vv, ci, v);
    for (int k = 0; k < kVerifyChunk; ++k) t[k] = w(ci * kVerifyChunk + k, v[k]);
    float& acc = lane[(ci - r.begin) % kVerifyLanes];
    acc = verify_add(acc, verify_chunk_sum(t));
  }
  return verify_tree_reduce(lane, [](float a, float b) { return verify_add(a, b); });
}

// Largest order key k* with W(key >= k*) >= target over the valid ids, W summing the integer weights
// w(j, value) (counts, or top-p mass in 2^-40 units: exact, so any summation order agrees); 0 when the
// total misses it. `relative`: target = frac · total W, at least 1.
template <LogitDType D, typename Wf>
uint32_t threshold_u64(Ptr<D> l, int64_t vv, double frac, bool relative, const Wf& w) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0, target = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    unsigned long long hist[256] = {};
    for (int64_t j = 0; j < vv; ++j) {
      const float v = LogitLoad<D>::load(l, j);
      const uint32_t key = float_key(v);
      if ((key & mask) == prefix) hist[(key >> shift) & 255u] += w(j, v);
    }
    if (shift == 24) {
      unsigned long long total = 0;
      for (unsigned long long h : hist) total += h;
      target = relative ? static_cast<unsigned long long>(frac * static_cast<double>(total))
                        : static_cast<unsigned long long>(frac);
      target = target ? target : 1ull;
    }
    const int digit = radix_pick_digit<unsigned long long>(hist, target, above);
    if (digit < 0) return 0u;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// A row's statistics after the passes: max M, Σ S relative to M, argmax, per-slice Σ (relative to M),
// the filter's key bound and status bits from the logits.
struct RowStats {
  float M = -kVerifyInf, S = 0.f, c = 1.f;
  int32_t arg = kVerifyNoId;
  uint32_t kmin = 0;
  int32_t status = 0;
  float slice[kVerifySlices] = {};
};

// Exact status bits of a slice whose NaN-propagating max is NaN or +inf (the rare error path); from the
// max alone otherwise: finite ⇒ a finite value and no NaN/+inf, −inf ⇒ no finite value.
template <LogitDType D>
void slice_flags(Ptr<D> l, int64_t vv, int s, float m, bool& bad, bool& finite) {
  if (m != m || m == kVerifyInf) {
    const SliceRange r = verify_slice_range(vv, s);
    const int64_t b = r.begin * kVerifyChunk, e = r.end * kVerifyChunk < vv ? r.end * kVerifyChunk : vv;
    const SlotScan scan = scan_slot<D>(l + b, e - b);
    bad |= (scan.status & kStatusNonFinite) != 0;
    finite |= !(scan.status & kStatusNoFinite);
  } else {
    finite |= m > -kVerifyInf;
  }
}

// Pass 1 over the slices, then (sampling rows with a filter) the thresholds and the filtered pass.
template <LogitDType D>
RowStats row_stats(Ptr<D> l, int64_t vv, bool greedy, float temperature, int32_t top_k, float top_p) {
  const bool topk = !greedy && top_k > 0 && top_k < vv, topp = !greedy && top_p < 1.f;
  const bool online = !greedy && !topk && !topp;  // Σ in pass 1; a filtered row sums after its threshold
  RowStats r;
  r.c = greedy ? 1.f : verify_exp2_scale(temperature);
  SliceStat rec[kVerifySlices];
  bool bad = false, finite = false;
  for (int s = 0; s < kVerifySlices; ++s) {
    rec[s] = online ? slice_stats<D, true>(l, vv, s, r.c) : slice_stats<D, false>(l, vv, s, r.c);
    slice_flags<D>(l, vv, s, rec[s].m, bad, finite);
  }
  SliceStat row = rec[0];
  for (int s = 1; s < kVerifySlices; ++s) row = verify_combine(row, rec[s], r.c, Exp2{});
  r.status = (bad ? kStatusNonFinite : 0) | (finite ? 0 : kStatusNoFinite);
  r.M = row.m;
  r.arg = row.arg;
  if (greedy || r.status) return r;
  if (online) {
    r.S = row.s;
    for (int s = 0; s < kVerifySlices; ++s) r.slice[s] = verify_rescaled(rec[s], r.M, r.c, Exp2{});
    return r;
  }
  const float M = r.M, c = r.c;
  if (topk) r.kmin = threshold_u64<D>(l, vv, top_k, false, [](int64_t, float) { return 1ull; });
  auto weight = [M, c, &r](float v) { return float_key(v) >= r.kmin ? Exp2{}(verify_mul(v - M, c)) : 0.f; };
  if (topp) {
    const uint32_t pmin = threshold_u64<D>(l, vv, top_p > 0.f ? top_p : 0.f, true, [&](int64_t, float v) {
      return static_cast<unsigned long long>(static_cast<double>(weight(v)) * kMassScale);
    });
    r.kmin = pmin > r.kmin ? pmin : r.kmin;
  }
  for (int s = 0; s < kVerifySlices; ++s)
    r.slice[s] = slice_sum<D>(l, vv, s, [&](int64_t, float v) { return weight(v); });
  r.S = r.slice[0];
  for (int s = 1; s < kVerifySlices; ++s) r.S = verify_add(r.S, r.slice[s]);
  return r;
}

// Inverse CDF inside slice s: lanes own contiguous chunk spans; their Σ w are scanned in the kernel's
// order; the first lane whose inclusive Σ exceeds target scans its ids in order. The last positive id of
// the last positive lane when rounding runs past the end; -1 when the slice has no positive weight.
template <typename Wf>
int64_t slice_pick(int64_t vv, int s, float target, const Wf& w) {
  const SliceRange r = verify_slice_range(vv, s);
  const int64_t span = verify_lane_span(vv);
  auto lane_ids = [&](int t, int64_t& b, int64_t& e) {
    b = r.begin + t * span < r.end ? r.begin + t * span : r.end;
    e = b + span < r.end ? b + span : r.end;
    b *= kVerifyChunk;
    e = e * kVerifyChunk < vv ? e * kVerifyChunk : vv;
  };
  float sum[kVerifyLanes], incl[kVerifyLanes];
  for (int t = 0; t < kVerifyLanes; ++t) {
    int64_t b, e;
    lane_ids(t, b, e);
    float acc = 0.f;
    for (int64_t j = b; j < e; ++j) acc = verify_add(acc, w(j));
    sum[t] = incl[t] = acc;
  }
  verify_lane_scan(incl);
  int lane = -1, last = -1;
  for (int t = 0; t < kVerifyLanes && lane < 0; ++t) {
    if (sum[t] > 0.f) last = t;
    if (sum[t] > 0.f && incl[t] > target) lane = t;
  }
  const bool hit = lane >= 0;
  if (!hit) lane = last;
  if (lane < 0) return -1;
  int64_t b, e, pos = -1;
  lane_ids(lane, b, e);
  float cum = incl[lane] - sum[lane];
  for (int64_t j = b; j < e; ++j) {
    const float x = w(j);
    if (!(x > 0.f)) continue;
    cum = verify_add(cum, x);
    pos = j;
    if (hit && cum > target) return j;
  }
  return pos;
}

// Picks the slice holding target among the per-slice masses R[s] (the first whose inclusive Σ exceeds
// it, else the last positive one, whose pick then falls back to its last positive id); -1: none.
inline int pick_slice(const float (&R)[kVerifySlices], float target, float& before, bool& hit) {
  float cum = 0.f;
  int last = -1;
  for (int s = 0; s < kVerifySlices; ++s) {
    if (!(R[s] > 0.f)) continue;
    const float next = verify_add(cum, R[s]);
    if (next > target) {
      before = cum;
      hit = true;
      return s;
    }
    cum = next;
    last = s;
  }
  hit = false;
  before = 0.f;
  return last;
}

// Token emitted at a rejected (or draft-less, or bonus) sampling slot, as the kernel's block_emit: the
// residual mass per slice (point-mass drafts: the slice's Σ minus e_x; draft_probs: a pass of max(e − q·S,
// 0)), R = 0 falling back to p minus x, then to p (status |= kStatusFallback); then pick_slice and
// slice_pick. The row's argmax when nothing is positive.
template <LogitDType D>
int64_t emit(Ptr<D> l, int64_t vv, const RowStats& r, const float* q, int64_t x, float ex, double u,
             int32_t& status) {
  auto e = [&r](float v) { return float_key(v) >= r.kmin ? Exp2{}(verify_mul(v - r.M, r.c)) : 0.f; };
  auto resid = [&](int64_t j, float v) {
    const float d = verify_add(e(v), -verify_mul(q[j], r.S));
    return d > 0.f ? d : 0.f;
  };
  const int64_t per = verify_slice_chunks(vv);
  float R[kVerifySlices];
  auto point_mass = [&](int64_t xx) {
    for (int s = 0; s < kVerifySlices; ++s) {
      const float d = xx >= 0 && xx / kVerifyChunk / per == s ? verify_add(r.slice[s], -ex) : r.slice[s];
      R[s] = d > 0.f ? d : 0.f;
    }
  };
  auto total = [&R] {
    float t = R[0];
    for (int s = 1; s < kVerifySlices; ++s) t = verify_add(t, R[s]);
    return t;
  };
  bool use_q = q && x >= 0;
  if (use_q) {
    for (int s = 0; s < kVerifySlices; ++s) R[s] = slice_sum<D>(l, vv, s, resid);
  } else {
    point_mass(x);
  }
  float tot = total();
  if (!(tot > 0.f)) {
    status |= kStatusFallback;
    if (use_q) {
      use_q = false;
      point_mass(x);
      tot = total();
    }
    if (!(tot > 0.f)) {
      x = -1;
      point_mass(x);
      tot = total();
    }
  }
  const float target = verify_mul(static_cast<float>(u), tot);
  float before;
  bool hit;
  const int s = pick_slice(R, target, before, hit);
  if (s < 0) return r.arg;
  auto w = [&](int64_t j) {
    const float v = LogitLoad<D>::load(l, j);
    return use_q ? resid(j, v) : (j == x ? 0.f : e(v));
  };
  const int64_t tok = slice_pick(vv, s, hit ? target - before : kVerifyInf, w);
  return tok < 0 ? r.arg : tok;
}

}  // namespace sliced
}  // namespace cpu
}  // namespace flashmap

// verify — CPU kernel (reference: flashmap_ext/reference.py::verify_reference; CUDA twin:
// verify_kernel.cu; shared rules: verify_core.h).
//
// Per batch row, slots are judged in order and the row stops at the first rejection, so only the
// slots that are reached pay for softmax statistics (the other slots get a cheap NaN/inf scan, since
// `status` covers all K+1 slots). Per reached sampling slot: pass A (max, finiteness), optional radix
// selection of the top-k threshold (4 passes of 8-bit digits on order keys), pass B (e_j = exp((l_j − m)/T)
// stored in scratch, S = Σ e), optional radix selection of the top-p threshold on the mass, accept
// test, and at the emitting slot one pass of residual chunk sums plus a scan of one chunk (inverse CDF).
//
// Parallelism: rows in parallel when B >= threads, else the vocab passes of one row in parallel. The
// vocabulary is cut in fixed chunks of kChunk ids whose partial results are combined in chunk order,
// so results never depend on the thread count or on batch-mates.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "accept/verify_core.h"
#include "accept/verify_glue.h"
#include "flashmap.h"

namespace flashmap {
namespace {

constexpr int64_t kChunk = 8192;  // ids per chunk: big enough to amortise a task, fixed for determinism
constexpr int64_t kSortedThreshold = 1024;  // below this many ids a sort beats 4 radix passes

struct Scratch {  // per-thread, reused across rows
  std::vector<float> e;         // e_j = exp((l_j − m) / T) of the current slot, 0 if filtered
  std::vector<double> partial;  // per-chunk partial sums
  std::vector<double> hist;     // per-chunk 256-bin radix histograms
  std::vector<float> max;       // per-chunk maxima
  std::vector<int> flags;       // per-chunk status bits (pass A)
};

Scratch& scratch(int64_t V) {
  thread_local Scratch s;
  const int64_t chunks = (V + kChunk - 1) / kChunk;
  if (static_cast<int64_t>(s.e.size()) < V) s.e.resize(V);
  if (static_cast<int64_t>(s.partial.size()) < chunks) s.partial.resize(chunks);
  if (static_cast<int64_t>(s.hist.size()) < chunks * 256) s.hist.resize(chunks * 256);
  if (static_cast<int64_t>(s.max.size()) < chunks) s.max.resize(chunks);
  if (static_cast<int64_t>(s.flags.size()) < chunks) s.flags.resize(chunks);
  return s;
}

// Runs f(chunk, begin, end) over the fixed chunks of [0, n), in parallel when `par`.
template <typename F>
void for_chunks(int64_t n, bool par, const F& f) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  auto body = [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) f(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  };
  if (par && chunks > 1) {
    at::parallel_for(0, chunks, 1, body);
  } else {
    body(0, chunks);
  }
}

// exp(x) for x <= 0, branch-free so loops vectorise (Cephes expf polynomial, ~2 ulp); 0 below −87.3.
inline float exp_nonpos(float x) {
  const float xc = x < -87.3f ? -87.3f : x;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
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
  float max = -std::numeric_limits<float>::infinity();
  int32_t status = 0;
};

// Pass A over ids [0, vv): max (NaN ignored) and the status bits of this slot.
template <LogitDType D>
SlotScan scan_slot(const typename LogitLoad<D>::T* l, int64_t vv, bool par, Scratch& s) {
  const int64_t chunks = (vv + kChunk - 1) / kChunk;
  for_chunks(vv, par, [&](int64_t c, int64_t j0, int64_t j1) {
    float m = -std::numeric_limits<float>::infinity();
    int nonfinite = 0, finite = 0;
#pragma omp simd reduction(max : m) reduction(| : nonfinite, finite)
    for (int64_t j = j0; j < j1; ++j) {
      const float v = LogitLoad<D>::load(l, j);
      m = v > m ? v : m;
      nonfinite |= (v != v) | (v == std::numeric_limits<float>::infinity());
      finite |= std::fabs(v) < std::numeric_limits<float>::infinity();
    }
    s.max[c] = m;
    s.flags[c] = (nonfinite ? 1 : 0) | (finite ? 2 : 0);
  });
  SlotScan out;
  int any_finite = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    out.max = std::max(out.max, s.max[c]);
    out.status |= (s.flags[c] & 1) ? kStatusNonFinite : 0;
    any_finite |= s.flags[c] & 2;
  }
  if (!any_finite) out.status |= kStatusNoFinite;
  return out;
}

// Lowest id whose logit equals the max (torch.argmax's tie rule).
template <LogitDType D>
int64_t first_argmax(const typename LogitLoad<D>::T* l, int64_t vv, float m) {
  for (int64_t j = 0; j < vv; ++j)
    if (LogitLoad<D>::load(l, j) == m) return j;
  return 0;
}

// Same threshold for small vocabularies: sort (key, weight) pairs by key, walk tie groups downwards.
template <LogitDType D, typename Wf>
uint32_t sorted_threshold(const typename LogitLoad<D>::T* l, int64_t vv, double target, const Wf& w) {
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

// Radix selection of the threshold key: the largest key k* with W(key >= k*) >= target, over ids
// [0, vv) weighted by w(j) (counts or mass). Returns 0 (keep all) when the total misses the target.
template <LogitDType D, typename Wf>
uint32_t radix_threshold(const typename LogitLoad<D>::T* l, int64_t vv, double target, const Wf& w,
                         bool par, Scratch& s) {
  if (vv <= kSortedThreshold) return sorted_threshold<D>(l, vv, target, w);
  const int64_t chunks = (vv + kChunk - 1) / kChunk;
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for_chunks(vv, par, [&](int64_t c, int64_t j0, int64_t j1) {
      double* h = s.hist.data() + c * 256;
      std::fill(h, h + 256, 0.0);
      for (int64_t j = j0; j < j1; ++j) {
        const uint32_t key = float_key(LogitLoad<D>::load(l, j));
        if ((key & mask) == prefix) h[(key >> shift) & 255u] += w(j);
      }
    });
    double hist[256] = {};
    for (int64_t c = 0; c < chunks; ++c)
      for (int d = 0; d < 256; ++d) hist[d] += s.hist[c * 256 + d];
    const int digit = radix_pick_digit<double>(hist, target, above);
    if (digit < 0) return 0u;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// Pass B: e_j = exp((l_j − m)/T) for ids with key >= kmin (else 0), into s.e; returns S = Σ e.
template <LogitDType D>
double fill_exp(const typename LogitLoad<D>::T* l, int64_t vv, float m, float inv_t, uint32_t kmin,
                bool par, Scratch& s) {
  float* e = s.e.data();
  for_chunks(vv, par, [&](int64_t c, int64_t j0, int64_t j1) {
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = j0; j < j1; ++j) {
      const float v = LogitLoad<D>::load(l, j);
      const float ej = float_key(v) >= kmin ? exp_nonpos((v - m) * inv_t) : 0.f;
      e[j] = ej;
      sum += ej;
    }
    s.partial[c] = sum;
  });
  double S = 0.0;
  for (int64_t c = 0; c < (vv + kChunk - 1) / kChunk; ++c) S += s.partial[c];
  return S;
}

// Filtered, unnormalised target weights of one sampling slot into s.e (DESIGN.md §3.1: temperature,
// then top-k, then top-p; ties at either threshold kept). Returns their sum S.
template <LogitDType D>
double slot_weights(const VerifyParams& p, int64_t b, const typename LogitLoad<D>::T* l, float m,
                    bool par, Scratch& s) {
  const int64_t vv = p.valid_vocab;
  uint32_t kmin = 0;
  if (verify_topk_on(p, b))
    kmin = radix_threshold<D>(l, vv, p.top_k[b], [](int64_t) { return 1.0; }, par, s);
  double S = fill_exp<D>(l, vv, m, verify_inv_temperature(p.temperature[b]), kmin, par, s);
  if (!verify_topp_on(p, b)) return S;
  const float* e = s.e.data();
  const double target = std::max(static_cast<double>(p.top_p[b]), 1e-300) * S;
  const uint32_t pmin = radix_threshold<D>(l, vv, target, [e](int64_t j) { return double(e[j]); }, par, s);
  return fill_exp<D>(l, vv, m, verify_inv_temperature(p.temperature[b]), std::max(kmin, pmin), par, s);
}

// Inverse-CDF sample of the residual at a rejected slot (or of p at the bonus / a draft-less slot):
// smallest id whose cumulative weight exceeds u·R. R = 0 falls back to p minus x, then to p.
int64_t sample_residual(const float* e, double S, const float* q, int64_t x, double u, int64_t vv,
                        bool par, Scratch& s, int32_t& status) {
  const int64_t chunks = (vv + kChunk - 1) / kChunk;
  auto total = [&](const float* qq, int64_t xx) {
    for_chunks(vv, par, [&](int64_t c, int64_t j0, int64_t j1) {
      double sum = 0.0;
      for (int64_t j = j0; j < j1; ++j) sum += verify_residual(e[j], S, qq, j, xx);
      s.partial[c] = sum;
    });
    double R = 0.0;
    for (int64_t c = 0; c < chunks; ++c) R += s.partial[c];
    return R;
  };
  double R = total(q, x);
  if (!(R > 0.0)) {  // degenerate residual: p minus x, else p
    status |= kStatusFallback;
    q = nullptr;
    R = total(nullptr, x);
    if (!(R > 0.0)) R = total(nullptr, x = -1);
  }
  const double target = u * R;
  double cum = 0.0;
  int64_t c = 0;
  while (c < chunks - 1 && cum + s.partial[c] <= target) cum += s.partial[c++];
  int64_t last = -1;
  for (int64_t j = c * kChunk; j < std::min(vv, (c + 1) * kChunk); ++j) {
    const double r = verify_residual(e[j], S, q, j, x);
    if (r <= 0.0) continue;
    cum += r;
    last = j;
    if (cum > target) return j;
  }
  for (int64_t j = vv - 1; last < 0 && j >= 0; --j)  // rounding ran past the end: last positive id
    if (verify_residual(e[j], S, q, j, x) > 0.0) last = j;
  return last < 0 ? 0 : last;
}

// One batch row: judge slots in order until the first rejection, then scan the remaining slots'
// status bits, then write the outputs (verify_write_row).
template <LogitDType D>
void verify_row(const VerifyParams& p, int64_t b, bool par) {
  using T = typename LogitLoad<D>::T;
  Scratch& s = scratch(p.V);
  const T* row = static_cast<const T*>(p.logits) + b * p.logits_stride_b;
  const int64_t vv = p.valid_vocab;
  const bool greedy = verify_is_greedy(p, b);
  int32_t status = 0;
  int64_t i = 0, emitted = 0;
  for (; i <= p.K; ++i) {
    const T* l = row + i * p.logits_stride_k;
    const SlotScan scan = scan_slot<D>(l, vv, par, s);
    status |= scan.status;
    if (status & kStatusErrors) break;
    const int64_t x = verify_draft(p, b, i);
    if (greedy) {
      emitted = first_argmax<D>(l, vv, scan.max);
      if (x >= 0 && x == emitted) continue;
      break;
    }
    const double S = slot_weights<D>(p, b, l, scan.max, par, s);
    const float* q = (p.draft_probs && i < p.K)
                         ? p.draft_probs + b * p.draft_probs_stride_b + i * p.draft_probs_stride_k : nullptr;
    if (x >= 0 && verify_accept(verify_coin(p, b, i, kStreamAccept), q ? q[x] : 1.0, s.e[x], S)) continue;
    emitted = sample_residual(s.e.data(), S, q, x, verify_coin(p, b, i, kStreamResample), vv, par, s, status);
    break;
  }
  for (int64_t k = i + 1; k <= p.K; ++k) status |= scan_slot<D>(row + k * p.logits_stride_k, vv, par, s).status;
  verify_write_row(p, b, i, emitted, status);
}

template <LogitDType D>
void verify_rows(const VerifyParams& p) {
  const bool rows_parallel = p.B >= at::get_num_threads() && p.B > 1;
  if (rows_parallel) {
    const int64_t grain = std::max<int64_t>(1, 65536 / ((p.K + 1) * p.V));  // ~64k logits per task
    at::parallel_for(0, p.B, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) verify_row<D>(p, b, false);
    });
  } else {
    for (int64_t b = 0; b < p.B; ++b) verify_row<D>(p, b, true);
  }
}

}  // namespace

VerifyResult verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed, const at::Tensor& position,
    const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab, const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.device().is_cpu(), "verify: target_logits must be a CPU tensor here");
  const VerifyTensors t = verify_prepare(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                         position, draft_probs, uniforms);
  const VerifyParams p = verify_params(t, valid_vocab);
  switch (p.logits_dtype) {
    case LogitDType::kF32: verify_rows<LogitDType::kF32>(p); break;
    case LogitDType::kF16: verify_rows<LogitDType::kF16>(p); break;
    case LogitDType::kBF16: verify_rows<LogitDType::kBF16>(p); break;
  }
  return {t.tokens, t.num_accepted, t.status};
}

TORCH_LIBRARY_IMPL(flashmap, CPU, m) { m.impl("verify", &verify_cpu); }

}  // namespace flashmap

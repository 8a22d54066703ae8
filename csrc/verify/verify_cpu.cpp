// verify — CPU kernel (reference: flashmap_ext/ops/verify_reference.py::verify_reference; CUDA twin:
// verify_kernel.cu; shared rules: verify_core.h; vocabulary loops: verify_cpu_loops.h).
//
// A slot is judged by one thread: max and status (one pass), optional top-k threshold (radix select),
// e_j = exp((l_j − m)/T) stored with S = Σ e (one pass), optional top-p threshold and a filtered
// re-pass, the accept test, and for a rejected / draft-less / bonus slot the inverse-CDF residual
// sample (one pass for R, one partial scan). A row stops at its first non-accepted slot; the slots
// after it only get their status scanned (logits, and the input checks of verify_input_status), since
// `status` covers all K+1 slots.
//
// Parallelism (ATen's OpenMP pool): rows in parallel when B >= threads (slots of a row in order);
// otherwise the slots of one row in parallel (verify_row). Each slot's arithmetic is the same in both
// modes, so results never depend on the thread count or on batch-mates.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "verify/verify_cpu_loops.h"
#include "verify/verify_cpu_sliced.h"
#include "verify/verify_glue.h"
#include "flashmap.h"

namespace flashmap {
namespace {

struct SlotOutcome {
  int32_t status = 0;
  bool accepted = false;
  int64_t token = 0;  // the draft when accepted, else the token this slot would emit
};

float* scratch(int64_t V) {  // per-thread buffer of e_j
  thread_local std::vector<float> e;
  if (static_cast<int64_t>(e.size()) < V) e.resize(V);
  return e.data();
}

template <LogitDType D>
cpu::Ptr<D> slot_logits(const VerifyParams& p, int64_t b, int64_t i) {
  return static_cast<cpu::Ptr<D>>(p.logits) + b * p.logits_stride_b + i * p.logits_stride_k;
}

// Filtered, unnormalised target weights of a sampling slot into e (temperature, then top-k, then
// top-p; ties at either threshold kept). Returns S = Σ e.
template <LogitDType D>
double slot_weights(const VerifyParams& p, int64_t b, cpu::Ptr<D> l, float m, float* e) {
  const int64_t vv = p.valid_vocab;
  const float inv_t = verify_inv_temperature(verify_temperature(p, b));
  uint32_t kmin = 0;
  if (verify_topk_on(p, b)) kmin = cpu::threshold_key<D>(l, vv, verify_top_k(p, b), [](int64_t) { return 1.0; });
  const double S = cpu::fill_exp<D>(l, vv, m, inv_t, kmin, e);
  if (!verify_topp_on(p, b)) return S;
  const double target = std::max(static_cast<double>(verify_top_p(p, b)), 1e-300) * S;
  const uint32_t pmin = cpu::threshold_key<D>(l, vv, target, [e](int64_t j) { return double(e[j]); });
  return cpu::fill_exp<D>(l, vv, m, inv_t, std::max(kmin, pmin), e);
}

// Residual sample at a non-accepted slot: ∝ max(p − q, 0) (p minus x for point-mass drafts, p when
// there is no draft); R = 0 falls back to p minus x, then to p (status |= kStatusFallback).
int64_t sample_residual(const float* e, double S, const float* q, int64_t x, double u, int64_t vv,
                        int32_t& status) {
  double R = cpu::residual_total(e, S, q, x, vv);
  if (!(R > 0.0)) {
    status |= kStatusFallback;
    q = nullptr;
    R = cpu::residual_total(e, S, nullptr, x, vv);
    if (!(R > 0.0)) R = cpu::residual_total(e, S, nullptr, x = -1, vv);
  }
  return cpu::residual_pick(e, S, q, x, vv, u * R);
}

// Judges slot i of row b (the same decision the CUDA slot kernel makes).
template <LogitDType D>
SlotOutcome judge_slot(const VerifyParams& p, int64_t b, int64_t i) {
  const cpu::Ptr<D> l = slot_logits<D>(p, b, i);
  const cpu::SlotScan scan = cpu::scan_slot<D>(l, p.valid_vocab);
  SlotOutcome out{scan.status | verify_input_status(p, b, i), false, 0};
  if (out.status & kStatusErrors) return out;
  const int64_t x = verify_draft(p, b, i);
  if (verify_is_greedy(p, b)) {
    out.token = cpu::first_argmax<D>(l, p.valid_vocab, scan.max);
    out.accepted = x >= 0 && x == out.token;
    return out;
  }
  float* e = scratch(p.V);
  const double S = slot_weights<D>(p, b, l, scan.max, e);
  const float* q = verify_draft_q(p, b, i);
  if (x >= 0 && verify_accept(verify_coin(p, b, i, kStreamAccept), q ? q[x] : 1.0, e[x], S)) {
    out.accepted = true;
    out.token = x;
    return out;
  }
  out.token = sample_residual(e, S, q, x, verify_coin(p, b, i, kStreamResample), p.valid_vocab, out.status);
  return out;
}

// Judges slot i of row b in the slice decomposition of the v2 CUDA kernel (verify_cpu_sliced.h).
template <LogitDType D>
SlotOutcome judge_slot_sliced(const VerifyParams& p, int64_t b, int64_t i) {
  namespace sl = cpu::sliced;
  const cpu::Ptr<D> l = slot_logits<D>(p, b, i);
  const int64_t vv = p.valid_vocab;
  const bool greedy = verify_is_greedy(p, b);
  const sl::RowStats r = sl::row_stats<D>(l, vv, greedy, verify_temperature(p, b), verify_top_k(p, b), verify_top_p(p, b));
  SlotOutcome out{r.status | verify_input_status(p, b, i), false, 0};
  if (out.status & kStatusErrors) return out;
  const int64_t x = verify_draft(p, b, i);
  if (greedy) {
    out.token = r.arg;
    out.accepted = x >= 0 && x == r.arg;
    return out;
  }
  const float vx = x >= 0 ? LogitLoad<D>::load(l, x) : 0.f;
  const float ex = x >= 0 && float_key(vx) >= r.kmin ? sl::Exp2{}(verify_mul(vx - r.M, r.c)) : 0.f;
  const float* q = verify_draft_q(p, b, i);
  if (x >= 0 && verify_accept(verify_coin(p, b, i, kStreamAccept), q ? q[x] : 1.0, ex, r.S)) {
    out.accepted = true;
    out.token = x;
    return out;
  }
  out.token = sl::emit<D>(l, vv, r, q, x, ex, verify_coin(p, b, i, kStreamResample), out.status);
  return out;
}

// One row. Workers pull slot indices in order from a shared counter: a slot at or before the first
// non-accepted slot found so far is judged, a later one only gets its status scanned. With `threads`
// workers at most threads − 1 slots are judged in vain, and there is one parallel region per row.
template <LogitDType D>
void verify_row(const VerifyParams& p, int64_t b, int64_t threads, bool sliced) {
  std::vector<SlotOutcome> out(p.K + 1);
  std::atomic<int64_t> next{0}, stop{p.K};  // slot K is never accepted
  auto work = [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i <= p.K; i = next.fetch_add(1)) {
      if (i > stop.load()) {
        out[i].status = cpu::scan_slot<D>(slot_logits<D>(p, b, i), p.valid_vocab).status |
                        verify_input_status(p, b, i);
        continue;
      }
      out[i] = sliced ? judge_slot_sliced<D>(p, b, i) : judge_slot<D>(p, b, i);
      if ((out[i].status & kStatusErrors) || !out[i].accepted) {
        int64_t cur = stop.load();
        while (i < cur && !stop.compare_exchange_weak(cur, i)) {}
      }
    }
  };
  if (threads > 1 && p.K > 0) {
    at::parallel_for(0, std::min(threads, p.K + 1), 1, work);
  } else {
    work(0, 1);
  }
  const int64_t j = stop.load();
  int32_t status = out[j].status;
  for (const SlotOutcome& o : out) status |= o.status & kStatusErrors;
  verify_write_row(p, b, j, out[j].token, status);
}

template <LogitDType D>
void verify_rows(const VerifyParams& p, bool sliced) {
  const int64_t threads = at::get_num_threads();
  if (p.B >= threads) {
    at::parallel_for(0, p.B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) verify_row<D>(p, b, 1, sliced);
    });
  } else {
    for (int64_t b = 0; b < p.B; ++b) verify_row<D>(p, b, threads, sliced);
  }
}

}  // namespace

namespace {
VerifyResult run_cpu(const VerifyTensors& t, const VerifyParams& p) {
  const VerifyKernel kernel = verify_kernel_choice();
  verify_check_kernel_limits(kernel, p);
  const bool sliced = kernel == VerifyKernel::kV2;
  switch (p.logits_dtype) {
    case LogitDType::kF32: verify_rows<LogitDType::kF32>(p, sliced); break;
    case LogitDType::kF16: verify_rows<LogitDType::kF16>(p, sliced); break;
    case LogitDType::kBF16: verify_rows<LogitDType::kBF16>(p, sliced); break;
  }
  return {t.tokens, t.num_accepted, t.status};
}
}  // namespace

VerifyResult verify_cpu(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                        const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                        const at::Tensor& seed, const at::Tensor& position,
                        const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                        const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.device().is_cpu(), "verify: target_logits must be a CPU tensor here");
  const VerifyTensors t = verify_prepare(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                         position, draft_probs, uniforms);
  return run_cpu(t, verify_params(t, valid_vocab));
}

VerifyResult verify_scalars_cpu(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
                                const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seed,
                                const std::optional<at::Tensor>& position, double temperature_value,
                                int64_t top_k_value, double top_p_value, int64_t seed_value, int64_t position_value,
                                const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                                const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.device().is_cpu(), "verify: target_logits must be a CPU tensor here");
  const VerifyTensors t = verify_prepare(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                         position, draft_probs, uniforms);
  const VerifyScalars v{temperature_value, top_p_value, top_k_value, seed_value, position_value};
  return run_cpu(t, verify_params(t, valid_vocab, v));
}

TORCH_LIBRARY_IMPL(flashmap, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("verify.scalars", &verify_scalars_cpu);
}

}  // namespace flashmap

// CPU kernels of the DiT drafter ops: ATen composites that compute in fp32 (fp64 for fp64 inputs) and
// round once to the input dtype, so on CPU each op is its reference up to summation order. References:
// flashmap_ext/ops/dit_reference.py; CUDA twins: dit_cuda.cpp. Argument rules: dit_args.h (shared with CUDA).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "dit/dit_args.h"
#include "dit/dit_ops.h"

namespace flashmap::dit {
namespace {

at::ScalarType compute_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Row m of a [G, N] conditioning tensor serves rows [m * M / G, (m + 1) * M / G) of an [M, N] tensor.
at::Tensor per_row(const at::Tensor& cond, int64_t M, at::ScalarType ct) {
  return cond.to(ct).repeat_interleave(M / cond.size(0), 0);
}

}  // namespace

at::Tensor adaln_cpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  check_adaln(x, shift, scale);
  const auto ct = compute_type(x);
  const at::Tensor xc = x.to(ct) - x.to(ct).mean(-1, true);
  const at::Tensor h = xc * at::rsqrt(xc.square().mean(-1, true) + eps);
  const int64_t M = x.size(0);
  return (h * (per_row(scale, M, ct) + 1) + per_row(shift, M, ct)).to(x.scalar_type());
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      c10::string_view activation, const std::optional<at::Tensor>& gate,
                      const std::optional<at::Tensor>& residual) {
  check_linear(x, weight, bias, gate, residual);
  const int act = parse_activation(std::string(activation));
  const auto ct = compute_type(x);
  at::Tensor y = at::matmul(x.to(ct), weight.to(ct).t());
  if (bias) y = y + bias->to(ct);
  if (act == 1) y = at::gelu(y, "tanh");
  if (act == 2) y = at::silu(y);
  if (gate) y = y * per_row(*gate, x.size(0), ct);
  if (residual) y = y + residual->to(ct);
  return y.to(x.scalar_type());
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& positions,
                        double theta, double eps) {
  check_rms_norm(x, weight, positions);
  const auto ct = compute_type(x);
  const at::Tensor xf = x.to(ct);
  at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true) + eps) * weight.to(ct);
  if (positions) {
    const int64_t D = x.size(2), half = D / 2;
    const at::Tensor inv_freq = at::pow(theta, at::arange(0, D, 2, xf.options()) * (-1.0 / D));
    const at::Tensor angle = (positions->to(ct).unsqueeze(1) * inv_freq).unsqueeze(1);  // [M, 1, D/2]
    const at::Tensor c = angle.cos(), s = angle.sin();
    const at::Tensor h1 = h.narrow(2, 0, half), h2 = h.narrow(2, half, half);
    h = at::cat({h1 * c - h2 * s, h2 * c + h1 * s}, 2);
  }
  return h.to(x.scalar_type());
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& kv_len, double scale) {
  check_attention(q, k, v, kv_len);
  const auto ct = compute_type(q);
  const int64_t B = q.size(0), Skv = k.size(1), D = q.size(3), groups = q.size(2) / k.size(2);
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  if (Skv == 0) return at::zeros(q.sizes(), q.options());  // no keys: every row is 0
  const at::Tensor qh = q.to(ct).transpose(1, 2);                                   // [B, Hq, Sq, D]
  const at::Tensor kh = k.to(ct).transpose(1, 2).repeat_interleave(groups, 1);     // [B, Hq, Skv, D]
  const at::Tensor vh = v.to(ct).transpose(1, 2).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(qh, kh.transpose(2, 3)) * s;                      // [B, Hq, Sq, Skv]
  at::Tensor valid = at::ones({B, Skv}, q.options().dtype(at::kBool));
  if (kv_len) valid = at::arange(Skv, kv_len->options().dtype(at::kLong)).unsqueeze(0) < kv_len->unsqueeze(1);
  valid = valid.view({B, 1, 1, Skv});
  scores = scores.masked_fill(valid.logical_not(), -INFINITY);
  const at::Tensor vm = vh.masked_fill(valid.transpose(2, 3).logical_not(), 0);  // rows past kv_len: any data
  // Softmax that maps a row without valid keys to 0 (instead of NaN).
  const at::Tensor mx = std::get<0>(scores.max(-1, true));
  const at::Tensor p = at::exp(scores - at::where(at::isinf(mx), at::zeros_like(mx), mx));
  const at::Tensor denom = p.sum(-1, true);
  const at::Tensor out = at::matmul(p, vm) / at::where(denom > 0, denom, at::ones_like(denom));
  return out.transpose(1, 2).contiguous().to(q.scalar_type());
}

void kv_append_cpu(const at::Tensor& cache, const at::Tensor& values, const at::Tensor& start,
                   const at::Tensor& count) {
  check_kv_append(cache, values, start, count);
  const at::Tensor st = start.contiguous(), ct = count.contiguous();
  const int* sp = st.data_ptr<int>();
  const int* cp = ct.data_ptr<int>();
  const int64_t L = cache.size(1), T = values.size(1);
  for (int64_t b = 0; b < cache.size(0); ++b) {
    const int64_t s = sp[b], n = std::min<int64_t>(cp[b], T);
    const int64_t lo = std::max<int64_t>(s, 0), hi = std::min<int64_t>(s + n, L);
    if (n <= 0 || lo >= hi) continue;
    cache.select(0, b).narrow(0, lo, hi - lo).copy_(values.select(0, b).narrow(0, lo - s, hi - lo));
  }
}

std::tuple<at::Tensor, at::Tensor> lm_head_cpu(const at::Tensor& x, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias, int64_t valid_vocab,
                                               bool return_logits, double softcap) {
  const int64_t valid = check_lm_head(x, weight, bias, valid_vocab);
  const auto ct = compute_type(x);
  at::Tensor logits = at::matmul(x.to(ct), weight.to(ct).t());
  if (bias) logits = logits + bias->to(ct);
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  const at::Tensor tokens = logits.narrow(1, 0, valid).argmax(1);
  const auto out_type = ct == at::kDouble ? at::kDouble : at::kFloat;
  return {tokens, return_logits ? logits.to(out_type) : at::empty({0}, x.options().dtype(out_type))};
}

TORCH_LIBRARY_IMPL(flashmap, CPU, m) {
  m.impl("dit_adaln", &adaln_cpu);
  m.impl("dit_linear", &linear_cpu);
  m.impl("dit_rms_norm", &rms_norm_cpu);
  m.impl("dit_attention", &attention_cpu);
  m.impl("dit_kv_append", &kv_append_cpu);
  m.impl("dit_lm_head", &lm_head_cpu);
}

}  // namespace flashmap::dit

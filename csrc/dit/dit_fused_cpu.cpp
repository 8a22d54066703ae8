// CPU twins of the fused DiT ops (FLASHMAP_DIT_FUSED_NORMS; CUDA: linear_kernel.cuh's adaLN prologue and
// head-norm / cache-append epilogues). They follow the kernels' order of operations: the CUDA prologue rounds
// the modulated row to the operand dtype before the MMA, and the epilogue rounds y before the row norm, so
// each twin is the unfused chain of CPU ops (dit_cpu.cpp) with the same rounding points.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "dit/dit_fused_args.h"
#include "dit/dit_ops.h"

namespace flashmap::dit {

at::Tensor norm_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           c10::string_view activation, const std::optional<at::Tensor>& shift,
                           const std::optional<at::Tensor>& scale, double adaln_eps,
                           const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                           int64_t heads, const std::optional<at::Tensor>& positions, double theta, double eps) {
  check_norm_linear(x, weight, bias, shift, scale, q_norm, k_norm, heads, positions);
  const at::Tensor h = shift ? adaln_cpu(x, *shift, *scale, adaln_eps) : x;
  at::Tensor y = linear_cpu(h, weight, bias, activation, std::nullopt, std::nullopt);
  if (!q_norm) return y;
  const int64_t M = x.size(0), D = q_norm->size(0), width = heads * D;
  int64_t col = 0;
  for (const auto& w : {q_norm, k_norm}) {
    if (!w) continue;
    at::Tensor part = y.narrow(1, col, width);
    part.copy_(rms_norm_cpu(part.reshape({M, heads, D}), *w, positions, theta, eps).view({M, width}));
    col += width;
  }
  return y;
}

void linear_kv_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& x,
                          const at::Tensor& weight, const std::optional<at::Tensor>& bias, const at::Tensor& k_norm,
                          const at::Tensor& start, const at::Tensor& count, double theta, double eps) {
  check_linear_kv_append(k_cache, v_cache, x, weight, bias, k_norm, start, count);
  const int64_t B = x.size(0), T = x.size(1), layers = k_cache.size(0), H = k_cache.size(3), D = k_cache.size(4);
  const at::Tensor y = linear_cpu(x.flatten(0, 1), weight, bias, "none", std::nullopt, std::nullopt)
                           .view({B, T, layers, 2, H, D});
  const at::Tensor pos = (start.to(at::kLong).unsqueeze(1) + at::arange(T, start.options().dtype(at::kLong)))
                             .reshape({B * T});
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor k = rms_norm_cpu(y.select(2, l).select(2, 0).reshape({B * T, H, D}), k_norm.select(0, l), pos,
                                      theta, eps);
    kv_append_cpu(k_cache.select(0, l), k.view({B, T, H, D}), start, count);
    kv_append_cpu(v_cache.select(0, l), y.select(2, l).select(2, 1), start, count);
  }
}

TORCH_LIBRARY_IMPL(flashmap, CPU, m) {
  m.impl("dit_norm_linear", &norm_linear_cpu);
  m.impl("dit_linear_kv_append", &linear_kv_append_cpu);
}

}  // namespace flashmap::dit

// Argument rules of the fused DiT ops (FLASHMAP_DIT_FUSED_NORMS), shared by the CPU (dit_fused_cpu.cpp) and
// CUDA (dit_fused_cuda.cpp) glue: the rules of the ops they fuse (dit_args.h) plus the head layout.
//   dit_norm_linear:      x [M, K], weight [N, K]; shift/scale [G, K] (adaLN prologue); q_norm/k_norm [D]
//                         over `heads` heads of D columns each (q: columns [0, heads*D), k: the next
//                         heads*D); positions [M] int64 (RoPE on the normed heads).
//   dit_linear_kv_append: k_cache/v_cache [n_layers, B, L, H, D], x [B, T, K], weight [n_layers*2*H*D, K],
//                         k_norm [n_layers, D], start/count [B] int32.
#pragma once

#include <initializer_list>
#include <utility>

#include "dit/dit_args.h"

namespace flashmap::dit {

inline void check_norm_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                              int64_t heads, const std::optional<at::Tensor>& positions) {
  constexpr const char* op = "dit_norm_linear";
  check_linear(x, weight, bias, std::nullopt, std::nullopt, op);
  TORCH_CHECK_VALUE(shift.has_value() == scale.has_value(), op, ": shift and scale go together (adaLN), got ",
                    shift ? "shift only" : "scale only");
  if (shift) check_adaln(x, *shift, *scale, op);
  TORCH_CHECK_VALUE(!k_norm || q_norm, op, ": k_norm needs q_norm (the key heads follow the query heads)");
  TORCH_CHECK_VALUE(!positions || q_norm, op, ": positions (RoPE) apply to normed heads: pass q_norm");
  if (!q_norm) return;
  const int64_t D = q_norm->dim() == 1 ? q_norm->size(0) : 0, N = weight.size(0);
  TORCH_CHECK_VALUE(D >= 1, op, ": q_norm must be [D] with D >= 1, got ", dims_str(q_norm->sizes()));
  expect_float_like(*q_norm, x, op, "q_norm");
  if (k_norm) {
    TORCH_CHECK_VALUE(k_norm->sizes() == q_norm->sizes(), op, ": k_norm must be [D] = [", D, "], got ",
                      dims_str(k_norm->sizes()));
    expect_float_like(*k_norm, x, op, "k_norm");
  }
  const int64_t groups = k_norm ? 2 : 1;
  TORCH_CHECK_VALUE(heads >= 1 && groups * heads * D <= N, op, ": heads must be >= 1 with ", groups,
                    " x heads x D <= N = ", N, ", got heads = ", heads, ", D = ", D);
  if (positions) {
    expect_index(*positions, at::kLong, x.size(0), x, op, "positions");
    TORCH_CHECK_VALUE(D % 2 == 0, op, ": RoPE needs an even head dim D, got ", D);
  }
}

inline void check_linear_kv_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& x,
                                   const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                   const at::Tensor& k_norm, const at::Tensor& start, const at::Tensor& count) {
  constexpr const char* op = "dit_linear_kv_append";
  expect_dim(x, 3, op, "x", "[B, T, K]");
  check_linear(x.flatten(0, 1), weight, bias, std::nullopt, std::nullopt, op);
  expect_dim(k_cache, 5, op, "k_cache", "[n_layers, B, L, H, D]");
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(), op, ": v_cache must have the shape of k_cache ",
                    dims_str(k_cache.sizes()), ", got ", dims_str(v_cache.sizes()));
  const int64_t layers = k_cache.size(0), B = k_cache.size(1), H = k_cache.size(3), D = k_cache.size(4);
  expect_size(x, 0, B, op, "x", "[B, T, K]");
  TORCH_CHECK_VALUE(weight.size(0) == layers * 2 * H * D, op, ": weight must be [n_layers * 2 * H * D, K] = [",
                    layers * 2 * H * D, ", K] (per layer the key heads, then the value heads), got ",
                    dims_str(weight.sizes()));
  TORCH_CHECK_VALUE(k_norm.dim() == 2 && k_norm.size(0) == layers && k_norm.size(1) == D, op,
                    ": k_norm must be [n_layers, D] = [", layers, ", ", D, "], got ", dims_str(k_norm.sizes()));
  TORCH_CHECK_VALUE(D % 2 == 0, op, ": RoPE needs an even head dim D, got ", D);
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&k_norm, "k_norm"}})
    expect_float_like(*t, x, op, name);
  expect_index(start, at::kInt, B, x, op, "start");
  expect_index(count, at::kInt, B, x, op, "count");
}

}  // namespace flashmap::dit

// Argument rules of the DiT ops, shared by the CPU (dit_cpu.cpp) and CUDA (dit_cuda.cpp) glue so both
// backends reject the same inputs with the same messages. Every message names the op and the argument.
// Shapes: M rows (B*K slots), N output features, K input features, G conditioning rows (M % G == 0),
// B batch, Sq queries, Skv keys, H heads, D head dim, V vocabulary, L cache rows, T new rows.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>

namespace flashmap::dit {

inline std::string dims_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline void expect_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", shape, ", got ", dims_str(t.sizes()));
}

inline void expect_size(const at::Tensor& t, int64_t d, int64_t n, const char* op, const char* name,
                        const char* shape) {
  TORCH_CHECK_VALUE(t.size(d) == n, op, ": ", name, " must be ", shape, " with size ", n, " in dim ", d,
                    ", got ", dims_str(t.sizes()));
}

inline void expect_float_like(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of x (",
                   c10::toString(ref.scalar_type()), "), got ", c10::toString(t.scalar_type()));
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device().str(), " but x is on ",
                    ref.device().str());
}

inline void expect_index(const at::Tensor& t, at::ScalarType dtype, int64_t n, const at::Tensor& ref,
                         const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ", c10::toString(dtype), ", got ",
                   c10::toString(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, op, ": ", name, " must be [", n, "], got ",
                    dims_str(t.sizes()));
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device().str(), " but ",
                    ref.device().str(), " was expected");
}

// dit_linear's activation names -> codes (0 none, 1 GELU-tanh, 2 SiLU; Activation in dit_params.h).
inline int parse_activation(const std::string& name) {
  if (name == "none") return 0;
  if (name == "gelu_tanh") return 1;
  if (name == "silu") return 2;
  TORCH_CHECK_VALUE(false, "dit_linear: activation must be 'none', 'gelu_tanh' or 'silu', got '", name, "'");
}

// dit_adaln: x [M, N], shift/scale [G, N], M % G == 0.
inline void check_adaln(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                        const char* op = "dit_adaln") {
  TORCH_CHECK_TYPE(c10::isFloatingType(x.scalar_type()), op, ": x must be a floating tensor");
  expect_dim(x, 2, op, "x", "[M, N]");
  expect_dim(shift, 2, op, "shift", "[G, N]");
  expect_size(shift, 1, x.size(1), op, "shift", "[G, N]");
  TORCH_CHECK_VALUE(scale.sizes() == shift.sizes(), op, ": scale must have the shape of shift ",
                    dims_str(shift.sizes()), ", got ", dims_str(scale.sizes()));
  TORCH_CHECK_VALUE(shift.size(0) >= 1 && x.size(0) % shift.size(0) == 0, op,
                    ": the rows of x (M = ", x.size(0), ") must be a multiple of the rows of shift (G = ",
                    shift.size(0), ")");
  expect_float_like(shift, x, op, "shift");
  expect_float_like(scale, x, op, "scale");
}

// dit_linear: x [M, K], weight [N, K], bias [N], gate [G, N] (M % G == 0), residual [M, N].
inline void check_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& gate, const std::optional<at::Tensor>& residual,
                         const char* op = "dit_linear") {
  TORCH_CHECK_TYPE(c10::isFloatingType(x.scalar_type()), op, ": x must be a floating tensor");
  expect_dim(x, 2, op, "x", "[M, K]");
  expect_dim(weight, 2, op, "weight", "[N, K]");
  expect_size(weight, 1, x.size(1), op, "weight", "[N, K]");
  expect_float_like(weight, x, op, "weight");
  const int64_t N = weight.size(0);
  if (bias) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, op, ": bias must be [N] = [", N, "], got ",
                      dims_str(bias->sizes()));
    expect_float_like(*bias, x, op, "bias");
  }
  if (gate) {
    expect_dim(*gate, 2, op, "gate", "[G, N]");
    expect_size(*gate, 1, N, op, "gate", "[G, N]");
    TORCH_CHECK_VALUE(gate->size(0) >= 1 && x.size(0) % gate->size(0) == 0, op, ": the rows of x (M = ",
                      x.size(0), ") must be a multiple of the rows of gate (G = ", gate->size(0), ")");
    expect_float_like(*gate, x, op, "gate");
  }
  if (residual) {
    TORCH_CHECK_VALUE(residual->dim() == 2 && residual->size(0) == x.size(0) && residual->size(1) == N, op,
                      ": residual must be [M, N] = [", x.size(0), ", ", N, "], got ", dims_str(residual->sizes()));
    expect_float_like(*residual, x, op, "residual");
  }
}

// dit_rms_norm: x [M, H, D], weight [D], positions [M] int64 (RoPE needs D even).
inline void check_rms_norm(const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& positions) {
  constexpr const char* op = "dit_rms_norm";
  TORCH_CHECK_TYPE(c10::isFloatingType(x.scalar_type()), op, ": x must be a floating tensor");
  expect_dim(x, 3, op, "x", "[M, H, D]");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(2), op, ": weight must be [D] = [",
                    x.size(2), "], got ", dims_str(weight.sizes()));
  expect_float_like(weight, x, op, "weight");
  if (positions) {
    expect_index(*positions, at::kLong, x.size(0), x, op, "positions");
    TORCH_CHECK_VALUE(x.size(2) % 2 == 0, op, ": RoPE needs an even head dim D, got ", x.size(2));
  }
}

// dit_attention: q [B, Sq, Hq, D], k/v [B, Skv, Hkv, D] (Hq % Hkv == 0), kv_len [B] int32.
inline void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& kv_len) {
  constexpr const char* op = "dit_attention";
  TORCH_CHECK_TYPE(c10::isFloatingType(q.scalar_type()), op, ": q must be a floating tensor");
  expect_dim(q, 4, op, "q", "[B, Sq, Hq, D]");
  expect_dim(k, 4, op, "k", "[B, Skv, Hkv, D]");
  expect_size(k, 0, q.size(0), op, "k", "[B, Skv, Hkv, D]");
  expect_size(k, 3, q.size(3), op, "k", "[B, Skv, Hkv, D]");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), op, ": v must have the shape of k ", dims_str(k.sizes()), ", got ",
                    dims_str(v.sizes()));
  TORCH_CHECK_VALUE(k.size(2) >= 1 && q.size(2) % k.size(2) == 0, op, ": the query heads (Hq = ", q.size(2),
                    ") must be a multiple of the key heads (Hkv = ", k.size(2), ")");
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
                   ": k and v must have the dtype of q (", c10::toString(q.scalar_type()), ")");
  TORCH_CHECK_VALUE(k.device() == q.device() && v.device() == q.device(), op, ": q, k, v must share a device");
  if (kv_len) expect_index(*kv_len, at::kInt, q.size(0), q, op, "kv_len");
}

// dit_kv_append: cache [B, L, H, D], values [B, T, H, D], start/count [B] int32.
inline void check_kv_append(const at::Tensor& cache, const at::Tensor& values, const at::Tensor& start,
                            const at::Tensor& count) {
  constexpr const char* op = "dit_kv_append";
  expect_dim(cache, 4, op, "cache", "[B, L, H, D]");
  expect_dim(values, 4, op, "values", "[B, T, H, D]");
  TORCH_CHECK_VALUE(values.size(0) == cache.size(0) && values.size(2) == cache.size(2) &&
                        values.size(3) == cache.size(3),
                    op, ": values must be [B, T, H, D] = [", cache.size(0), ", T, ", cache.size(2), ", ",
                    cache.size(3), "], got ", dims_str(values.sizes()));
  TORCH_CHECK_TYPE(values.scalar_type() == cache.scalar_type(), op, ": values must have the dtype of cache (",
                   c10::toString(cache.scalar_type()), "), got ", c10::toString(values.scalar_type()));
  TORCH_CHECK_VALUE(values.device() == cache.device(), op, ": values must be on the device of cache");
  expect_index(start, at::kInt, cache.size(0), cache, op, "start");
  expect_index(count, at::kInt, cache.size(0), cache, op, "count");
}

// dit_lm_head: x [M, K], weight [V, K], bias [V]; returns the resolved valid vocabulary (<= 0 means V).
inline int64_t check_lm_head(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             int64_t valid_vocab) {
  check_linear(x, weight, bias, std::nullopt, std::nullopt, "dit_lm_head");
  const int64_t V = weight.size(0);
  TORCH_CHECK_VALUE(V >= 1, "dit_lm_head: weight must have at least one row");
  TORCH_CHECK_VALUE(valid_vocab <= V, "dit_lm_head: valid_vocab must be <= V = ", V, ", got ", valid_vocab);
  return valid_vocab <= 0 ? V : valid_vocab;
}

}  // namespace flashmap::dit

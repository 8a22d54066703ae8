// Torch glue shared by the CPU and CUDA verify registrations: validates the op's arguments (messages
// name the argument and the expected shape/dtype) and builds VerifyParams. Knows nothing of the math.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>

#include "verify/verify_params.h"
#include "verify/verify_slices.h"
#include "common/check.h"

namespace flashmap {

// The verify kernels in use: FLASHMAP_VERIFY_KERNEL unset or "v1" the default ones (verify_kernel.cu and
// verify_cpu.cpp's vectorised loops), "v2" the sliced ones (verify_v2_kernel.cu and its CPU twin,
// verify_cpu_sliced.h; DESIGN.md §3.1). Read at every call; a captured CUDA graph keeps its capture's choice.
enum class VerifyKernel { kV1, kV2 };
inline VerifyKernel verify_kernel_choice() {
  const char* v = std::getenv("FLASHMAP_VERIFY_KERNEL");
  if (!v || !*v || !std::strcmp(v, "v1")) return VerifyKernel::kV1;
  TORCH_CHECK_VALUE(!std::strcmp(v, "v2"), "verify: FLASHMAP_VERIFY_KERNEL must be v1 (the default) or v2, got '",
                    v, "'");
  return VerifyKernel::kV2;
}

// The v2 kernels index ids with 32-bit integers.
inline void verify_check_kernel_limits(VerifyKernel k, const VerifyParams& p) {
  TORCH_CHECK_VALUE(k == VerifyKernel::kV1 || p.valid_vocab < (int64_t{1} << 31) - kVerifyChunk,
                    "verify: FLASHMAP_VERIFY_KERNEL=v2 supports valid_vocab < 2^31 - 8, got ", p.valid_vocab);
}

struct VerifyTensors {  // keeps possibly-copied inputs alive while the kernel runs
  at::Tensor logits, drafts, temperature, top_k, top_p, seed, position, draft_probs, uniforms;
  at::Tensor tokens, num_accepted, status;
};

inline LogitDType verify_logit_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return LogitDType::kF32;
    case at::kHalf: return LogitDType::kF16;
    case at::kBFloat16: return LogitDType::kBF16;
    default:
      TORCH_CHECK_TYPE(false, "verify: target_logits must be bfloat16, float16 or float32, got ",
                       c10::toString(t.scalar_type()));
  }
}

// A [B] sampling parameter, or an undefined tensor when the caller passes its value instead (VerifyScalars).
inline at::Tensor verify_per_row(const std::optional<at::Tensor>& t, const at::Tensor& ref, const char* name,
                                 at::ScalarType dtype, int64_t B) {
  if (!t.has_value()) return at::Tensor();
  check_shape(*t, "verify", name, "[B]", {B});
  check_dtype(*t, "verify", name, dtype);
  check_same_device(*t, ref, "verify", name);
  return t->contiguous();
}

// The values of the sampling parameters passed by value (the `verify.scalars` overload): used for every row
// whose parameter tensor is absent. Out-of-domain values are flagged per row by the kernels (status 16).
struct VerifyScalars {
  double temperature = 0.0, top_p = 1.0;
  int64_t top_k = 0, seed = 0, position = 0;
};

inline VerifyTensors verify_prepare(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                    const std::optional<at::Tensor>& temperature,
                                    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                                    const std::optional<at::Tensor>& seed,
                                    const std::optional<at::Tensor>& position,
                                    const std::optional<at::Tensor>& draft_probs,
                                    const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.dim() == 3, "verify: target_logits must be [B, K+1, V], got ",
                    shape_str(target_logits.sizes()));
  verify_logit_dtype(target_logits);
  const int64_t B = target_logits.size(0), K = target_logits.size(1) - 1, V = target_logits.size(2);
  TORCH_CHECK_VALUE(B >= 1 && K >= 0 && V >= 1, "verify: target_logits [B, K+1, V] needs B >= 1, K+1 >= 1 "
                    "and V >= 1, got ", shape_str(target_logits.sizes()));
  VerifyTensors t;
  t.logits = target_logits.stride(2) == 1 ? target_logits : target_logits.contiguous();
  check_shape(draft_tokens, "verify", "draft_tokens", "[B, K]", {B, K});
  check_dtype(draft_tokens, "verify", "draft_tokens", at::kLong);
  check_same_device(draft_tokens, target_logits, "verify", "draft_tokens");
  t.drafts = draft_tokens.contiguous();
  t.temperature = verify_per_row(temperature, target_logits, "temperature", at::kFloat, B);
  t.top_k = verify_per_row(top_k, target_logits, "top_k", at::kInt, B);
  t.top_p = verify_per_row(top_p, target_logits, "top_p", at::kFloat, B);
  t.seed = verify_per_row(seed, target_logits, "seed", at::kLong, B);
  t.position = verify_per_row(position, target_logits, "position", at::kLong, B);
  if (draft_probs.has_value()) {
    check_shape(*draft_probs, "verify", "draft_probs", "[B, K, V]", {B, K, V});
    check_dtype(*draft_probs, "verify", "draft_probs", at::kFloat);
    check_same_device(*draft_probs, target_logits, "verify", "draft_probs");
    t.draft_probs = draft_probs->stride(2) == 1 ? *draft_probs : draft_probs->contiguous();
  }
  if (uniforms.has_value()) {
    check_shape(*uniforms, "verify", "uniforms", "[B, K+1]", {B, K + 1});
    check_dtype(*uniforms, "verify", "uniforms", at::kDouble);
    check_same_device(*uniforms, target_logits, "verify", "uniforms");
    t.uniforms = uniforms->contiguous();
  }
  const auto opts = target_logits.options();
  t.tokens = at::empty({B, K + 1}, opts.dtype(at::kLong));
  t.num_accepted = at::empty({B}, opts.dtype(at::kInt));
  t.status = at::empty({B}, opts.dtype(at::kInt));
  return t;
}

inline VerifyParams verify_params(const VerifyTensors& t, int64_t valid_vocab, const VerifyScalars& v = {}) {
  const int64_t B = t.logits.size(0), K = t.logits.size(1) - 1, V = t.logits.size(2);
  TORCH_CHECK_VALUE(valid_vocab <= V, "verify: valid_vocab must be <= V = ", V, " (<= 0 means V), got ",
                    valid_vocab);
  VerifyParams p{};
  p.logits = t.logits.data_ptr();
  p.logits_dtype = verify_logit_dtype(t.logits);
  p.logits_stride_b = t.logits.stride(0);
  p.logits_stride_k = t.logits.stride(1);
  p.draft_tokens = t.drafts.data_ptr<int64_t>();
  p.temperature = t.temperature.defined() ? t.temperature.data_ptr<float>() : nullptr;
  p.top_k = t.top_k.defined() ? t.top_k.data_ptr<int32_t>() : nullptr;
  p.top_p = t.top_p.defined() ? t.top_p.data_ptr<float>() : nullptr;
  p.seed = t.seed.defined() ? t.seed.data_ptr<int64_t>() : nullptr;
  p.position = t.position.defined() ? t.position.data_ptr<int64_t>() : nullptr;
  p.temperature_value = static_cast<float>(v.temperature);
  p.top_p_value = static_cast<float>(v.top_p);
  p.top_k_value = static_cast<int32_t>(v.top_k > 0x7FFFFFFF ? 0x7FFFFFFF : (v.top_k < -1 ? -1 : v.top_k));
  p.seed_value = v.seed;
  p.position_value = v.position;
  if (t.draft_probs.defined()) {
    p.draft_probs = t.draft_probs.data_ptr<float>();
    p.draft_probs_stride_b = t.draft_probs.stride(0);
    p.draft_probs_stride_k = t.draft_probs.stride(1);
  }
  p.uniforms = t.uniforms.defined() ? t.uniforms.data_ptr<double>() : nullptr;
  p.tokens = t.tokens.data_ptr<int64_t>();
  p.num_accepted = t.num_accepted.data_ptr<int32_t>();
  p.status = t.status.data_ptr<int32_t>();
  p.B = B;
  p.K = K;
  p.V = V;
  p.valid_vocab = valid_vocab <= 0 ? V : valid_vocab;
  return p;
}

}  // namespace flashmap

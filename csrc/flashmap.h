// One declaration per op of the flashmap library (schemas: registration.cpp; Python: flashmap_ext/ops/).
// Dimension letters: B batch, K draft slots, V vocabulary.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace flashmap {

// Fused acceptance step (DESIGN.md §3.1). target_logits [B, K+1, V] bf16|fp16|fp32, draft_tokens [B, K]
// int64, temperature [B] fp32, top_k [B] int32, top_p [B] fp32, seed [B] int64, position [B] int64,
// draft_probs [B, K, V] fp32 or none, valid_vocab (<= 0: V), uniforms [B, K+1] fp64 or none
// -> tokens [B, K+1] int64, num_accepted [B] int32, status [B] int32.
// CPU: csrc/verify/verify_cpu.cpp; CUDA: csrc/verify/verify_cuda.cpp + verify_kernel.cu.
using VerifyResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
VerifyResult verify_cpu(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                        const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                        const at::Tensor& seed, const at::Tensor& position,
                        const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                        const std::optional<at::Tensor>& uniforms);
VerifyResult verify_cuda(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                         const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                         const at::Tensor& seed, const at::Tensor& position,
                         const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                         const std::optional<at::Tensor>& uniforms);

// verify.scalars: the same op with each sampling parameter a [B] tensor or, when that tensor is None, the
// value that follows (passed by value: no fill kernel per call).
VerifyResult verify_scalars_cpu(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
                                const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seed,
                                const std::optional<at::Tensor>& position, double temperature_value,
                                int64_t top_k_value, double top_p_value, int64_t seed_value, int64_t position_value,
                                const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                                const std::optional<at::Tensor>& uniforms);
VerifyResult verify_scalars_cuda(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                 const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
                                 const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seed,
                                 const std::optional<at::Tensor>& position, double temperature_value,
                                 int64_t top_k_value, double top_p_value, int64_t seed_value, int64_t position_value,
                                 const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                                 const std::optional<at::Tensor>& uniforms);

}  // namespace flashmap

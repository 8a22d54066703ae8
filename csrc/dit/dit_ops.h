// Host declarations of the DiT drafter ops (schemas: csrc/registration.cpp; Python: flashmap_ext/ops/dit.py;
// references: flashmap_ext/ops/dit_reference.py). CPU: dit_cpu.cpp (ATen composites, compute in fp32, fp64
// for fp64 inputs). CUDA: dit_cuda.cpp -> norm.cu, linear.cu, attention.cu (bf16 only).
// Letters: M rows (B*K slots), N out features, K in features, G conditioning rows, B batch, Sq queries,
// Skv keys, H heads, D head dim, V vocabulary, L cache rows, T new rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace flashmap::dit {

// x [M, N], shift/scale [G, N] -> [M, N]: LayerNorm (no affine) then h * (1 + scale) + shift.
at::Tensor adaln_cpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);
// x [M, K], weight [N, K], bias [N], gate [G, N], residual [M, N] -> residual + gate * act(x W^T + b) [M, N].
at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      c10::string_view activation, const std::optional<at::Tensor>& gate,
                      const std::optional<at::Tensor>& residual);
// x [M, H, D], weight [D], positions [M] int64 -> RMSNorm(x) * weight, then RoPE if positions [M, H, D].
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& positions,
                        double theta, double eps);
// q [B, Sq, Hq, D], k/v [B, Skv, Hkv, D], kv_len [B] int32 -> [B, Sq, Hq, D].
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& kv_len, double scale);
// cache [B, L, H, D] (mutated), values [B, T, H, D], start/count [B] int32.
void kv_append_cpu(const at::Tensor& cache, const at::Tensor& values, const at::Tensor& start,
                   const at::Tensor& count);
// x [M, K], weight [V, K], bias [V] -> tokens [M] int64, logits [M, V] fp32 (or [0] when not asked for).
std::tuple<at::Tensor, at::Tensor> lm_head_cpu(const at::Tensor& x, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias, int64_t valid_vocab,
                                               bool return_logits, double softcap);


// Fused ops (FLASHMAP_DIT_FUSED_NORMS; rules: dit_fused_args.h). CPU twins: dit_fused_cpu.cpp.
// x [M, K] -> y = act(adaln(x, shift, scale) W^T + b) [M, N] (no adaLN without shift/scale), then per row
// the `heads` query heads (columns [0, heads*D)) RMS-normed with q_norm [D] and, with k_norm, the next
// `heads` key heads with k_norm; RoPE at positions [M] on the normed heads. Every rounding point of the
// unfused chain kept: the adaLN output and y are rounded to x's dtype before the next stage reads them.
at::Tensor norm_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           c10::string_view activation, const std::optional<at::Tensor>& shift,
                           const std::optional<at::Tensor>& scale, double adaln_eps,
                           const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                           int64_t heads, const std::optional<at::Tensor>& positions, double theta, double eps);
// The memory entries x [B, T, K] through the K/V projection of every layer (weight [n_layers*2*H*D, K]:
// per layer H key heads then H value heads), keys RMS-normed with k_norm[layer] and rotated at position
// start[b] + t, both appended at cache row start[b] + t for t < count[b] (rows outside [0, L) dropped).
void linear_kv_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& x,
                          const at::Tensor& weight, const std::optional<at::Tensor>& bias, const at::Tensor& k_norm,
                          const at::Tensor& start, const at::Tensor& count, double theta, double eps);

}  // namespace flashmap::dit

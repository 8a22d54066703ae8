// VerifyParams: everything the verify kernels (CPU and CUDA) see — raw pointers, strides in elements,
// sizes. No torch types. Built and validated by csrc/verify/verify_glue.h.
#pragma once

#include <cstdint>

namespace flashmap {

enum class LogitDType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// status [B] bit flags (mirrored once in flashmap_ext/ops/status.py).
enum VerifyStatus : int32_t {
  kStatusNonFinite = 1,     // a NaN or +inf logit among the valid ids of some slot (error)
  kStatusNoFinite = 2,      // some slot has no finite logit among the valid ids (error)
  kStatusFallback = 4,      // residual mass was 0: sampled from p instead (informational)
  kStatusBadDraftProb = 8,  // a sampling slot's draft_probs give its draft q(x) outside (0, 1] (error)
  kStatusBadParams = 16,    // temperature NaN, negative or +inf, top_p NaN or outside [0, 1], or top_k < 0 (error)
};
constexpr int32_t kStatusErrors = kStatusNonFinite | kStatusNoFinite | kStatusBadDraftProb | kStatusBadParams;

struct VerifyParams {
  // Inputs. target_logits [B, K+1, V] with stride 1 over V.
  const void* logits;
  LogitDType logits_dtype;
  int64_t logits_stride_b, logits_stride_k;
  const int64_t* draft_tokens;  // [B, K] contiguous
  // Sampling parameters: [B] arrays, or nullptr and the value below for every row (passed by value: no
  // fill kernel per call). Read through verify_core.h's accessors.
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const int64_t* seed;
  const int64_t* position;
  float temperature_value, top_p_value;
  int32_t top_k_value;
  int64_t seed_value, position_value;
  const float* draft_probs;     // [B, K, V] with stride 1 over V, or nullptr (point-mass drafts)
  int64_t draft_probs_stride_b, draft_probs_stride_k;
  const double* uniforms;       // [B, K+1] contiguous, or nullptr (Philox coins)
  // Outputs, contiguous.
  int64_t* tokens;        // [B, K+1]
  int32_t* num_accepted;  // [B]
  int32_t* status;        // [B]
  // Sizes.
  int64_t B, K, V;
  int64_t valid_vocab;  // 1..V: ids >= valid_vocab are never emitted
};

}  // namespace flashmap

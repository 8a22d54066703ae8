// The per-row arithmetic of the DiT norms, shared by the standalone norm kernels (norm.cu) and the fused
// prologue / epilogues of the linear (linear_fused.cuh, FLASHMAP_DIT_FUSED_NORMS): both paths run the same
// reductions in the same order and round at the same points, so the fused kernels equal the unfused ones.
//   adaln_row_moments: one warp's LayerNorm statistics of a bf16 row (two passes over 16-byte vectors:
//                      lane-strided sums, then warp_sum; mean, then the sum of squared deviations).
//   adaln_modulate:    (x - mean) * rstd * (1 + scale) + shift, in fp32.
//   rms_rope_vector:   one warp's RMSNorm of a D-vector (lane l owns elements l, l + 32, ...) times weight,
//                      then optionally rotate-half RoPE (rope_cos_sin); one rounding to bf16 per output.
#pragma once

#include "dit/dit_common.cuh"

namespace flashmap::dit {

struct RowMoments {
  float mean, rstd;
};

// x: a row of N bf16 (N % 8 == 0, 16-byte aligned). Every lane returns the statistics.
__device__ __forceinline__ RowMoments adaln_row_moments(const uint16_t* x_row, int N, float eps, int lane) {
  const uint4* x = reinterpret_cast<const uint4*>(x_row);
  const int nvec = N / 8;
  float f[8];
  float sum = 0.f;
  for (int i = lane; i < nvec; i += 32) {
    unpack8(x[i], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += f[j];
  }
  const float mean = warp_sum(sum) / N;
  float sq = 0.f;
  for (int i = lane; i < nvec; i += 32) {
    unpack8(x[i], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) sq += (f[j] - mean) * (f[j] - mean);
  }
  return {mean, rsqrtf(warp_sum(sq) / N + eps)};
}

__device__ __forceinline__ float adaln_modulate(float x, RowMoments s, float scale, float shift) {
  return (x - s.mean) * s.rstd * (1.f + scale) + shift;
}

// cos and sin of RoPE pair i (angle pos * theta^(-2i/D)).
__device__ __forceinline__ float2 rope_cos_sin(float pos, int i, int D, float theta) {
  const float inv_freq = powf(theta, -static_cast<float>(2 * i) / D);
  float sn, cs;
  sincosf(pos * inv_freq, &sn, &cs);
  return {cs, sn};
}

// load(i) -> float (a bf16 value), store(i, bf16 bits), cos_sin(i) -> rope_cos_sin of pair i (computed in
// place, or read from a table the caller filled with it); weight [D] bf16. The rotation pairs (i, i + D/2)
// stay in one lane (D even when rope).
template <class Load, class Store, class CosSin>
__device__ __forceinline__ void rms_rope_vector(const Load& load, const Store& store, const uint16_t* weight, int D,
                                                float eps, bool rope, const CosSin& cos_sin, int lane) {
  float sq = 0.f;
  for (int i = lane; i < D; i += 32) {
    const float v = load(i);
    sq += v * v;
  }
  const float rstd = rsqrtf(warp_sum(sq) / D + eps);
  auto normed = [&](int i) { return load(i) * rstd * bf16_bits_to_float(weight[i]); };
  if (!rope) {
    for (int i = lane; i < D; i += 32) store(i, float_to_bf16_bits(normed(i)));
    return;
  }
  const int half = D / 2;
  for (int i = lane; i < half; i += 32) {
    const float2 cs = cos_sin(i);
    const float a = normed(i), b = normed(i + half);
    store(i, float_to_bf16_bits(a * cs.x - b * cs.y));
    store(i + half, float_to_bf16_bits(b * cs.x + a * cs.y));
  }
}

}  // namespace flashmap::dit

// The two normalisations of the DiT drafter (DESIGN.md §5.2). References: flashmap_ext/ops/dit_reference.py::
// adaln and ::rms_norm.
//
// adaln_kernel: adaLN modulate fused into LayerNorm, out = LN(x) * (1 + scale) + shift, LN without affine
// parameters. One warp per row; three passes over the row in 16-byte vectors (8 bf16): sum -> mean,
// sum of squared deviations -> variance (two-pass, so no cancellation), then normalise, modulate and store.
// The statistics and the modulation are norm_rows.cuh's, shared with the linear's fused adaLN prologue.
// The row (<= a few KB) stays in L1 between passes. Statistics in fp32, output rounded once to bf16.
// Invariants: N % 8 == 0 and every row start 16-byte aligned (the glue checks); shift/scale row g serves
// rows [g * rows_per_cond, (g + 1) * rows_per_cond) (one conditioning vector per batch row, K slots each).
//
// rms_norm_kernel: out = x * rsqrt(mean(x^2) + eps) * weight per (row, head) vector of D elements (QK-norm
// with H heads, or a whole-width RMSNorm with H = 1), then optionally rotate-half RoPE at the row's
// absolute position: out[i] = n[i] cos(a_i) - n[i + D/2] sin(a_i), out[i + D/2] = n[i + D/2] cos(a_i) +
// n[i] sin(a_i), a_i = pos * theta^(-2i/D). One warp per vector; lane l owns elements l, l + 32, ... of
// each half, so a rotation pair stays in one lane. fp32 throughout, one rounding to bf16 at the store.
#include "dit/dit_common.cuh"
#include "dit/dit_launch.cuh"
#include "dit/dit_params.h"
#include "dit/dit_tuning.h"
#include "dit/norm_rows.cuh"

namespace flashmap::dit {

__global__ void __launch_bounds__(tuning::kNormWarpsPerCta * 32) adaln_kernel(AdaLNParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * tuning::kNormWarpsPerCta + threadIdx.x / 32;
  grid_dependency_wait();  // x, shift and scale come from earlier kernels
  grid_dependents_launch();
  if (row >= p.M) return;
  const int g = row / p.rows_per_cond;
  const uint4* x = reinterpret_cast<const uint4*>(p.x + row * p.x_stride);
  const uint4* shift = reinterpret_cast<const uint4*>(p.shift + g * p.shift_stride);
  const uint4* scale = reinterpret_cast<const uint4*>(p.scale + g * p.scale_stride);
  uint4* out = reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(row) * p.N);
  const RowMoments s = adaln_row_moments(p.x + row * p.x_stride, p.N, p.eps, lane);
  for (int i = lane; i < p.N / 8; i += 32) {
    float f[8], sh[8], sc[8];
    unpack8(x[i], f);
    unpack8(shift[i], sh);
    unpack8(scale[i], sc);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = adaln_modulate(f[j], s, sc[j], sh[j]);
    out[i] = pack8(f);
  }
}

__global__ void __launch_bounds__(tuning::kNormWarpsPerCta * 32) rms_norm_kernel(RmsNormParams p) {
  const int lane = threadIdx.x % 32;
  const int vec = blockIdx.x * tuning::kNormWarpsPerCta + threadIdx.x / 32;  // (row, head) pair
  grid_dependency_wait();  // x and the positions come from earlier kernels
  grid_dependents_launch();
  if (vec >= p.M * p.H) return;
  const int row = vec / p.H, head = vec % p.H;
  const bf16_bits* x = p.x + row * p.x_row + head * p.x_head;
  bf16_bits* out = p.out + static_cast<int64_t>(vec) * p.D;
  const bool rope = p.positions != nullptr;
  const float pos = rope ? static_cast<float>(p.positions[row]) : 0.f;
  rms_rope_vector([&](int i) { return bf16_bits_to_float(x[i]); }, [&](int i, bf16_bits v) { out[i] = v; },
                  p.weight, p.D, p.eps, rope, [&](int i) { return rope_cos_sin(pos, i, p.D, p.theta); }, lane);
}

void rms_norm_launch(const RmsNormParams& p, cudaStream_t stream) {
  const int vecs = p.M * p.H;
  if (vecs == 0) return;
  constexpr int kWarps = tuning::kNormWarpsPerCta;
  launch_dit_kernel(rms_norm_kernel, LaunchShape{dim3((vecs + kWarps - 1) / kWarps), dim3(kWarps * 32)}, stream, p);
}

void adaln_launch(const AdaLNParams& p, cudaStream_t stream) {
  if (p.M == 0) return;
  constexpr int kWarps = tuning::kNormWarpsPerCta;
  launch_dit_kernel(adaln_kernel, LaunchShape{dim3((p.M + kWarps - 1) / kWarps), dim3(kWarps * 32)}, stream, p);
}

}  // namespace flashmap::dit

// Small device helpers shared by the DiT kernels: bf16 vector packing, warp reductions, the epilogue
// activations, the argmax order used by torch.argmax (NaN is the maximum, lowest index wins ties), and the
// two points of programmatic dependent launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace flashmap::dit {

// 8 bf16 in one 16-byte vector <-> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// Two floats -> one 32-bit register of two bf16 (low half = first), the MMA operand format.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<uint16_t*>(&h);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// GELU with the tanh approximation (torch.nn.functional.gelu(approximate="tanh")) and SiLU, in fp32.
__device__ __forceinline__ float gelu_tanh(float y) {
  constexpr float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * y * (1.f + tanhf(kAlpha * (y + 0.044715f * y * y * y)));
}

__device__ __forceinline__ float silu(float y) { return y / (1.f + __expf(-y)); }

// True when (a, ia) comes before (b, ib) in torch.argmax order: NaN beats everything, larger value wins,
// lowest index wins ties (among NaNs too).
__device__ __forceinline__ bool argmax_better(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

// Warp-wide argmax in that order; every lane returns the winner.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (argmax_better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Programmatic dependent launch (FLASHMAP_DIT_PDL=1; the launch: dit_launch.cuh). A kernel launched with it
// may start while the kernel before it in the stream still runs. Every DiT kernel therefore calls
// grid_dependency_wait() in every thread before it reads anything an earlier kernel may write (activations,
// the memory cache and its lengths, counters, workspaces) and before its first global write; only reads of
// data no kernel of the step writes (the packed weights) may come before it. It returns once every
// prerequisite grid has completed and its writes are visible. grid_dependents_launch() lets the next kernel
// start its own weight loads; it says nothing about this grid's writes (the next kernel's wait covers them).
// Both are no-ops in a grid launched without the attribute, and compiled out below sm_90 (the launch function
// launches such binaries without it).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace flashmap::dit

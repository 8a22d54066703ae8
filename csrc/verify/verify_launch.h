// Plain C++ entry points of the verify CUDA kernels (verify_kernel.cu, verify_v2_kernel.cu), called by the torch glue
// (verify_cuda.cpp). Enqueues on `stream`; never synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "verify/verify_params.h"

namespace flashmap {

void verify_cuda_launch(const VerifyParams& params, cudaStream_t stream);
int64_t verify_cuda_max_vocab();
// The v2 kernel (verify_v2_kernel.cu; FLASHMAP_VERIFY_KERNEL=v2): counters [B] int32, zero on entry and
// left zero. Returns the launch's error.
cudaError_t verify_v2_cuda_launch(const VerifyParams& params, int* counters, cudaStream_t stream);  // largest valid_vocab whose tile records fit in shared memory

}  // namespace flashmap

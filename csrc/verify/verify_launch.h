// Plain C++ entry point of the verify CUDA kernels (verify_kernel.cu), called by the torch glue
// (verify_cuda.cpp). Enqueues on `stream`; never synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "verify/verify_params.h"

namespace flashmap {

void verify_cuda_launch(const VerifyParams& params, cudaStream_t stream);
int64_t verify_cuda_max_vocab();  // largest valid_vocab whose tile records fit in shared memory

}  // namespace flashmap

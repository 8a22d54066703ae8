// Torch side of the fixup counters (dit/fixup_counters.h): int32, zero on entry; every kernel that uses them
// resets each counter it used before it exits (the DiT split-K linear, lm_head argmax and split attention;
// verify v2's per-batch-row arrival counters). A captured launch takes them from its device's shared buffer
// (cudaMalloc, outside any graph pool) instead of adding a memset node; an uncaptured one takes a fresh
// zeroed tensor (safe on any stream) and grows the buffer, so that the capture after a warm-up finds it
// large enough. When the pool has no buffer for the capture, a fresh zeroed tensor (a memset node).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>

#include "dit/fixup_counters.h"

namespace flashmap {

struct Counters {
  at::Tensor fresh;  // owns `ptr` when it is not the shared buffer
  int* ptr = nullptr;
};

inline Counters fixup_counters(const at::Tensor& like, size_t n) {
  if (n == 0) return {};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &capture, &capture_id));
  if (dit::CounterPool* pool = dit::counter_pool(like.get_device())) {
    if (capture == cudaStreamCaptureStatusNone) {
      (void)pool->reserve(n, stream);  // a failed growth only costs later captures their memset node
    } else if (capture == cudaStreamCaptureStatusActive) {
      if (int* shared = pool->for_capture(capture_id, stream, n)) return {at::Tensor(), shared};
    }
  }
  at::Tensor fresh = at::zeros({int64_t(n)}, like.options().dtype(at::kInt));
  return {fresh, fresh.data_ptr<int>()};
}

}  // namespace flashmap

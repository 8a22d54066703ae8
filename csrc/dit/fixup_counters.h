// The fixup counters that captured DiT kernels share (split-K linear, lm_head argmax, split attention;
// DESIGN.md §10): one zeroed int32 buffer per device, from cudaMalloc and never from torch's caching
// allocator — a CUDA-graph pool (torch.compile reduce-overhead routes even its uncaptured warm-up there)
// would otherwise own it — and never freed: captured graphs hold its address. The kernels leave every
// counter they used at zero, so the buffer needs one memset per growth. CUDA runtime only, no torch:
// python_tests/ops/test_fixup_counters.py compiles it on a CPU machine against a fake runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "dit/dit_switches.h"

namespace flashmap::dit {

// FLASHMAP_SHARED_COUNTERS=0: every captured launch takes its own zeroed counters (a memset node), for
// programs that replay graphs concurrently on two streams of one device (the case the buffer cannot serve).
inline bool shared_counters_enabled() {
  const char* v = std::getenv("FLASHMAP_SHARED_COUNTERS");
  return !(v && std::strcmp(v, "0") == 0);
}

// FLASHMAP_DIT_NODE_WORKSPACES=1 or FLASHMAP_DIT_PDL=1 (off by default): every captured launch gets its own
// slice of the buffer (and the glue keeps each captured launch's workspace until the capture ends), so no two
// nodes of a graph share a counter or a workspace: the precondition for programmatic dependent launch, where
// a node may start before its predecessor has finished.
inline bool node_workspaces_enabled() { return node_workspaces_requested(); }

class CounterPool {
 public:
  // Per-node mode: a buffer of at least kNodeFloor counters (the ~150 launches of a 2-step draft graph
  // need a few thousand), slices aligned to kNodeAlign counters (128 bytes).
  static constexpr size_t kNodeFloor = size_t(1) << 16;
  static constexpr size_t kNodeAlign = 32;

  CounterPool() : enabled_(shared_counters_enabled()), per_node_(node_workspaces_enabled()) {}
  explicit CounterPool(bool enabled, bool per_node = false) : enabled_(enabled), per_node_(per_node) {}

  // An uncaptured call that needs n counters on `stream`: grows the buffer to max(n, 2 x its size) so
  // that a later capture finds n (cudaMalloc, one cudaMemsetAsync to zero, then a sync of `stream`, so no
  // later launch on any stream sees it unzeroed). The old buffer stays allocated. A failed growth leaves
  // the buffer as it was and clears the error (captures then fall back); its error is returned.
  cudaError_t reserve(size_t n, cudaStream_t stream) {
    if (!enabled_) return cudaSuccess;
    const std::lock_guard<std::mutex> lock(mu_);
    if (per_node_ && n < kNodeFloor) n = kNodeFloor;
    if (n <= ints_) return cudaSuccess;
    const size_t ints = n > 2 * ints_ ? n : 2 * ints_;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, ints * sizeof(int));
    if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, ints * sizeof(int), stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      if (p) (void)cudaFree(p);  // no graph has seen it
      (void)cudaGetLastError();
      return err;
    }
    buf_ = static_cast<int*>(p);
    ints_ = ints;
    return cudaSuccess;
  }

  // A call captured on `stream` (capture = its id from cudaStreamGetCaptureInfo) that needs n counters:
  // the buffer, or nullptr when the caller must take fresh zeroed counters (a memset node) — sharing
  // off, the buffer smaller than n, or a stream other than the first one of that capture (a forked
  // capture, whose branches may run concurrently; the last kRecent captures are remembered).
  // Per-node mode: the next unused slice of n counters of that capture's buffer (nullptr once it is full).
  int* for_capture(unsigned long long capture, cudaStream_t stream, size_t n) {
    if (!enabled_) return nullptr;
    const std::lock_guard<std::mutex> lock(mu_);
    if (n > ints_) return nullptr;
    for (Owner& o : recent_)
      if (o.used && o.capture == capture) return o.stream == stream ? slice(o, n) : nullptr;
    recent_[next_] = {capture, stream, true, 0};
    Owner& o = recent_[next_];
    next_ = (next_ + 1) % kRecent;
    return slice(o, n);
  }

  size_t size() const { return ints_; }

 private:
  static constexpr int kRecent = 8;
  struct Owner {
    unsigned long long capture;
    cudaStream_t stream;
    bool used;
    size_t next_free;  // per-node mode: counters of the buffer this capture has handed out
  };
  int* slice(Owner& o, size_t n) {
    if (!per_node_) return buf_;
    if (o.next_free + n > ints_) return nullptr;
    int* p = buf_ + o.next_free;
    o.next_free += (n + kNodeAlign - 1) / kNodeAlign * kNodeAlign;
    return p;
  }
  const bool enabled_, per_node_;
  std::mutex mu_;
  int* buf_ = nullptr;
  size_t ints_ = 0;
  Owner recent_[kRecent] = {};
  int next_ = 0;
};

// The pool of a device (0 <= device < kMaxDevices), else nullptr; created on first use, never destroyed.
inline CounterPool* counter_pool(int device) {
  constexpr int kMaxDevices = 64;
  static auto* pools = new CounterPool[kMaxDevices];
  return device >= 0 && device < kMaxDevices ? &pools[device] : nullptr;
}

}  // namespace flashmap::dit

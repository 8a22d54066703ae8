// Shared-memory sizing of the verify slot kernel: pure host arithmetic (no CUDA headers), compiled and
// checked on a CPU machine (python_tests/test_cuda_host_math.py); the launcher (verify_kernel.cu) uses it.
//
// The slot kernel keeps 3 fp32 records (max, sum, residual) per 256-id tile in dynamic shared memory, on
// top of its static BlockScratch. A launch may use more than 48 KiB of shared memory in total, static
// plus dynamic, only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raised the dynamic limit, so
// the opt-in depends on the sum, not on the dynamic bytes alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashmap {

constexpr int64_t kVerifyTileIds = 256;                 // ids per warp tile (verify_kernel.cu: kTile)
constexpr size_t kVerifyDefaultSmemBytes = 48 * 1024;   // per block without the opt-in
constexpr size_t kVerifyMaxDynamicSmemBytes = 200 * 1024;  // budget under Hopper's 227 KiB per block

inline size_t verify_dynamic_smem_bytes(int64_t valid_vocab) {
  const int64_t tiles = (valid_vocab + kVerifyTileIds - 1) / kVerifyTileIds;
  return static_cast<size_t>(3 * tiles) * sizeof(float);
}

// True when a launch with these dynamic and static bytes needs the > 48 KiB opt-in.
inline bool verify_needs_smem_optin(size_t dynamic_bytes, size_t static_bytes) {
  return dynamic_bytes + static_bytes > kVerifyDefaultSmemBytes;
}

// Largest valid_vocab whose tile records fit the dynamic budget.
inline int64_t verify_max_vocab() {
  return static_cast<int64_t>(kVerifyMaxDynamicSmemBytes / (3 * sizeof(float))) * kVerifyTileIds;
}

}  // namespace flashmap

// The per-slot result word of the CUDA verify kernels and the combine that turns a batch row's K+1 words
// into its outputs (verify_kernel.cu: a separate combine kernel; verify_v2_kernel.cu: the last slot to
// finish a batch row). Device code only.
#pragma once

#include <cstdint>

#include "verify/verify_core.h"

namespace flashmap {

// Packed per-slot result written into tokens[b, i]: candidate token, accepted?, status bits.
__device__ __forceinline__ int64_t pack_slot(int64_t token, bool accepted, int32_t status) {
  return token | (static_cast<int64_t>(accepted) << 32) | (static_cast<int64_t>(status) << 33);
}

// Batch row b from its K+1 packed words: the first non-accepted slot emits; error bits of every slot
// count, the fallback bit only from the emitting slot. Rewrites tokens[b, :] in place (verify_write_row).
__device__ __forceinline__ void combine_row(const VerifyParams& p, int64_t b) {
  const int64_t* row = p.tokens + b * (p.K + 1);
  int32_t status = 0;
  int64_t j = -1, token = 0;
  for (int64_t i = 0; i <= p.K; ++i) {
    const int64_t v = row[i];
    const int32_t st = static_cast<int32_t>(v >> 33);  // every status bit (pack_slot)
    status |= st & kStatusErrors;
    if (j < 0 && !((v >> 32) & 1)) {
      j = i;
      token = v & 0xFFFFFFFFll;
      status |= st & kStatusFallback;
    }
  }
  verify_write_row(p, b, j < 0 ? p.K : j, token, status);
}

}  // namespace flashmap

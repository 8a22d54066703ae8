// Counter-based Philox4x32-10 RNG (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3";
// constants and round structure as in Random123 / cuRAND), usable from host and device code alike so
// that the CPU and CUDA kernels draw identical coins. Python twin: flashmap_ext/rng.py
// (philox4x32_10_words, verify_uniform); known-answer vectors are checked in python_tests/ops/test_verify_exact.py.
//
// FlashMap's convention: key = seed (64 bits), counter = (position, stream, 0) where position is the
// absolute token position (64 bits) and stream separates the consumers of randomness at one position.
#pragma once

#include <cstdint>

#include "common/macros.h"

namespace flashmap {

// Streams at one position: the verifier's accept coin, its resample/bonus coin, the drafter's noise.
enum PhiloxStream : uint32_t { kStreamAccept = 0, kStreamResample = 1, kStreamDrafter = 2 };

struct Philox4 {
  uint32_t x[4];
};

FM_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// One Philox4x32 block: 10 rounds, key bumped between rounds.
FM_HOST_DEVICE Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c.x[0], hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c.x[2], hi1, lo1);
    c = Philox4{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
  }
  return c;
}

// 24-bit uniform in [0, 1): exactly representable in fp32, never 1.0, so `u < p` rejects p = 0.
FM_HOST_DEVICE float philox_uniform24(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// The coin of (seed, position, stream): first word of the block, as a 24-bit uniform.
FM_HOST_DEVICE float philox_coin(int64_t seed, int64_t position, uint32_t stream) {
  const uint64_t s = static_cast<uint64_t>(seed), p = static_cast<uint64_t>(position);
  const Philox4 out = philox4x32_10(
      Philox4{{static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), stream, 0u}},
      static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32));
  return philox_uniform24(out.x[0]);
}

}  // namespace flashmap

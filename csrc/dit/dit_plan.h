// Split-K / flash-decoding plans of the DiT kernels: pure host arithmetic (no CUDA headers), so the plans
// are compiled and checked on a CPU machine (python_tests/test_cuda_host_math.py). The launchers
// (linear.cu, attention.cu) call these with the device's SM count.
#pragma once

#include <algorithm>
#include <cstddef>

#include "dit/dit_tuning.h"
#include "dit/split_reduce.h"

namespace flashmap::dit {

struct LinearPlan {
  int tile_m, tile_n, tiles_m, tiles_n, splits;
  bool cluster;           // the splits of a tile form one thread-block cluster (no partials, no counters)
  size_t partial_floats;  // fp32 elements of `partials`
  size_t argmax_slots;    // elements of argmax_val / argmax_idx
  size_t counters;        // int32 counters, to be zero-initialised
};

// The caps of a plan: the tuning defaults, or the split sweep's overrides (dit_switches.h).
struct LinearPlanCaps {
  int max_splits = tuning::kLinearMaxSplits;
  int ctas_per_sm = tuning::kLinearCtasPerSm;
  bool cluster = false;  // split-K in a cluster: at most kMaxClusterSplits splits
};

// M == 0 or N == 0 is an empty launch (no tiles, no workspace): the plan never divides by the tile count.
inline LinearPlan linear_plan_for(int M, int N, int K, bool argmax, int sms, const LinearPlanCaps& caps = {}) {
  LinearPlan plan{};
  plan.tile_m = M <= tuning::kLinearSmallTileM ? tuning::kLinearSmallTileM : tuning::kLinearLargeTileM;
  plan.tile_n = tuning::kLinearTileN;
  plan.splits = 1;
  if (M <= 0 || N <= 0) return plan;
  plan.tiles_m = (M + plan.tile_m - 1) / plan.tile_m;
  plan.tiles_n = (N + plan.tile_n - 1) / plan.tile_n;
  const int tiles = plan.tiles_m * plan.tiles_n;
  const int k_tiles = K / tuning::kLinearTileK;
  const int want = (caps.ctas_per_sm * sms + tiles - 1) / tiles;
  const int cap = caps.cluster ? std::min(caps.max_splits, kMaxClusterSplits) : caps.max_splits;
  const int splits = std::min({want, k_tiles / tuning::kLinearMinKTilesPerSplit, cap});
  plan.splits = argmax ? 1 : std::max(splits, 1);
  plan.cluster = caps.cluster && plan.splits > 1;
  plan.partial_floats = plan.splits > 1 && !plan.cluster ? size_t(plan.splits) * M * N : 0;
  plan.argmax_slots = argmax ? size_t(plan.tiles_n) * M : 0;
  plan.counters = plan.cluster ? 0 : size_t(tiles) + plan.tiles_m;
  return plan;
}

}  // namespace flashmap::dit

// Host side of the small-M linear layer (kernel and algorithm: linear_kernel.cuh): the split-K plan and the
// launch. Also hosts sm_count(), shared by the DiT launchers.
#include <algorithm>

#include "dit/linear_kernel.cuh"

namespace flashmap::dit {

int sm_count(int device) {
  static int cache[64] = {};  // per device; a benign race writes the same value
  if (device < 0 || device >= 64) return 132;
  if (cache[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 132;
    cache[device] = n;
  }
  return cache[device];
}

LinearPlan linear_plan(int M, int N, int K, bool argmax, int device) {
  LinearPlan plan{};
  plan.tile_m = M <= tuning::kLinearSmallTileM ? tuning::kLinearSmallTileM : tuning::kLinearLargeTileM;
  plan.tile_n = tuning::kLinearTileN;
  plan.tiles_m = (M + plan.tile_m - 1) / plan.tile_m;
  plan.tiles_n = (N + plan.tile_n - 1) / plan.tile_n;
  const int tiles = plan.tiles_m * plan.tiles_n;
  const int k_tiles = K / tuning::kLinearTileK;
  const int want = (tuning::kLinearCtasPerSm * sm_count(device) + tiles - 1) / tiles;
  int splits = std::min({want, k_tiles / tuning::kLinearMinKTilesPerSplit, tuning::kLinearMaxSplits});
  plan.splits = argmax ? 1 : std::max(splits, 1);
  plan.partial_floats = plan.splits > 1 ? size_t(plan.splits) * M * N : 0;
  plan.argmax_slots = argmax ? size_t(plan.tiles_n) * M : 0;
  plan.counters = size_t(tiles) + plan.tiles_m;
  return plan;
}

template <int kTileM>
static void launch_tile(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream) {
  using Traits = LinearTraits<kTileM>;
  auto kernel = linear_kernel<Traits>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  LinearParams q = p;  // the split count always comes from the plan
  q.splits = plan.splits;
  const dim3 grid(plan.tiles_n, plan.splits, plan.tiles_m);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(q);
}

void linear_launch(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream) {
  if (p.M == 0 || p.N == 0) return;
  if (plan.tile_m == tuning::kLinearSmallTileM) launch_tile<tuning::kLinearSmallTileM>(p, plan, stream);
  else launch_tile<tuning::kLinearLargeTileM>(p, plan, stream);
}

}  // namespace flashmap::dit

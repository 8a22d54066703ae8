// Host side of the small-M linear layer (kernel and algorithm: linear_kernel.cuh): the split-K plan and the
// launch. Also hosts sm_count(), shared by the DiT launchers.
#include <algorithm>

#include "dit/dit_launch.cuh"
#include "dit/dit_switches.h"
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
  const DitSwitches& sw = dit_switches();
  const LinearPlanCaps caps{sw.max_splits, sw.ctas_per_sm, sw.cluster_splitk};
  return linear_plan_for(M, N, K, argmax, M > 0 && N > 0 ? sm_count(device) : 0, caps);
}

// The instantiation for the fused norms a launch asks for (FLASHMAP_DIT_FUSED_NORMS; linear_fused.cuh). The
// glue never combines the adaLN prologue with the cache append (dit_linear_kv_append has no adaLN).
template <class Traits>
static auto linear_kernel_for(const LinearParams& p) {
  using E = LinearEpilogue;
  if (p.adaln_prologue)
    return p.epilogue == E::kHeadNorm ? linear_kernel<Traits, true, E::kHeadNorm> : linear_kernel<Traits, true>;
  if (p.epilogue == E::kHeadNorm) return linear_kernel<Traits, false, E::kHeadNorm>;
  if (p.epilogue == E::kKvAppend) return linear_kernel<Traits, false, E::kKvAppend>;
  return linear_kernel<Traits>;
}

template <int kTileM>
static void launch_tile(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream) {
  using Traits = LinearTraits<kTileM>;
  auto kernel = linear_kernel_for<Traits>(p);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  LinearParams q = p;  // the split count and the reduction always come from the plan
  q.splits = plan.splits;
  q.cluster_splitk = plan.cluster;
  q.batched_fixup = dit_switches().batched_fixup;
  q.pdl = dit_switches().pdl;
  LaunchShape shape{dim3(plan.tiles_n, plan.splits, plan.tiles_m), dim3(Traits::kThreads), Traits::kSmemBytes};
  shape.cluster_y = plan.cluster ? plan.splits : 0;
  launch_dit_kernel(kernel, shape, stream, q);
}

void linear_launch(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream) {
  if (p.M == 0 || p.N == 0) return;
  if (plan.tile_m == tuning::kLinearSmallTileM) launch_tile<tuning::kLinearSmallTileM>(p, plan, stream);
  else launch_tile<tuning::kLinearLargeTileM>(p, plan, stream);
}

}  // namespace flashmap::dit

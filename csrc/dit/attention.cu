// Host side of the drafter attention (kernel and algorithm: attention_kernel.cuh) and the in-place memory
// cache append. Reference: flashmap_ext/ops/dit_reference.py::attention, ::kv_append.
//
// kv_append_kernel: one CTA per (new row t, batch row b) copies row t of `values` (H heads x D) to cache
// row start[b] + t when t < count[b] and the target row lies in [0, Lmax); 16-byte vectors (D % 8 == 0
// and strides multiples of 8, checked by the glue). Rows are independent: copy order does not matter.
#include <algorithm>

#include "dit/attention_kernel.cuh"
#include "dit/dit_launch.cuh"
#include "dit/dit_switches.h"

namespace flashmap::dit {

bool attention_supports_head_dim(int D) { return D == 64 || D == 128; }

AttentionPlan attention_plan(int B, int Sq, int Skv, int Hq, int D, int device) {
  (void)D;
  AttentionPlan plan{};
  plan.q_tiles = (Sq + tuning::kAttnQueriesPerTile - 1) / tuning::kAttnQueriesPerTile;
  const int blocks = (Skv + tuning::kAttnKeysPerBlock - 1) / tuning::kAttnKeysPerBlock;
  const int base = std::max(B * Hq * plan.q_tiles, 1);
  const int want = (tuning::kAttnCtasPerSm * sm_count(device) + base - 1) / base;
  int splits = std::min({want, blocks / tuning::kAttnMinBlocksPerSplit, tuning::kAttnMaxSplits});
  splits = std::max(splits, 1);
  const int blocks_per_split = std::max((blocks + splits - 1) / splits, 1);
  plan.splits = std::max((blocks + blocks_per_split - 1) / blocks_per_split, 1);  // no split empty by capacity
  plan.keys_per_split = blocks_per_split * tuning::kAttnKeysPerBlock;
  const size_t slots = size_t(B) * Hq * plan.splits * Sq;
  plan.partial_o_floats = plan.splits > 1 ? slots * D : 0;
  plan.partial_lse_floats = plan.splits > 1 ? slots : 0;
  plan.counters = size_t(B) * Hq * plan.q_tiles;
  return plan;
}

template <int kD>
static void launch_head_dim(const AttentionParams& p, const AttentionPlan& plan, cudaStream_t stream) {
  using Traits = AttentionTraits<kD>;
  auto kernel = attention_kernel<Traits>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  AttentionParams q = p;  // the split geometry always comes from the plan
  q.splits = plan.splits;
  q.keys_per_split = plan.keys_per_split;
  q.length_splits = dit_switches().length_splits;
  q.parallel_merge = dit_switches().parallel_merge;
  const LaunchShape shape{dim3(plan.splits, p.Hq, p.B * plan.q_tiles), dim3(Traits::kThreads), Traits::kSmemBytes};
  launch_dit_kernel(kernel, shape, stream, q);
}

void attention_launch(const AttentionParams& p, const AttentionPlan& plan, cudaStream_t stream) {
  if (p.B == 0 || p.Sq == 0 || p.Hq == 0) return;
  if (p.D == 64) launch_head_dim<64>(p, plan, stream);
  else launch_head_dim<128>(p, plan, stream);
}

__global__ void __launch_bounds__(tuning::kAppendThreads) kv_append_kernel(KvAppendParams p) {
  const int t = blockIdx.x, b = blockIdx.y;
  grid_dependency_wait();  // start, count and values come from earlier kernels
  grid_dependents_launch();
  const int row = p.start[b] + t;
  if (t >= p.count[b] || row < 0 || row >= p.Lmax) return;
  const bf16_bits* src = p.values + b * p.values_batch + t * p.values_row;
  bf16_bits* dst = p.cache + b * p.cache_batch + row * p.cache_row;
  const int vecs = p.D / 8;
  for (int i = threadIdx.x; i < p.H * vecs; i += tuning::kAppendThreads) {
    const int h = i / vecs, c = (i % vecs) * 8;
    *reinterpret_cast<uint4*>(dst + h * p.cache_head + c) = *reinterpret_cast<const uint4*>(src + h * p.values_head + c);
  }
}

void kv_append_launch(const KvAppendParams& p, cudaStream_t stream) {
  if (p.B == 0 || p.T == 0 || p.H == 0 || p.D == 0) return;
  launch_dit_kernel(kv_append_kernel, LaunchShape{dim3(p.T, p.B), dim3(tuning::kAppendThreads)}, stream, p);
}

}  // namespace flashmap::dit

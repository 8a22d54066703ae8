// The one launch path of the DiT kernels (norm.cu, linear.cu, attention.cu). With the default switches a
// plain launch (kernel<<<grid, block, smem, stream>>>), or cudaLaunchKernelEx with the cluster attribute for a
// cluster split-K linear; with FLASHMAP_DIT_PDL=1 (dit_switches.h) every launch is cudaLaunchKernelEx with
// cudaLaunchAttributeProgrammaticStreamSerialization added, when the kernel's binary for this device has the
// griddepcontrol instructions (sm_90+, dit_common.cuh): the kernel may then start before its predecessor
// has finished and waits for it in grid_dependency_wait(). A launch error is left for the glue's launch check.
#pragma once

#include <cuda_runtime.h>

#include "dit/dit_switches.h"

namespace flashmap::dit {

struct LaunchShape {
  dim3 grid, block;
  size_t smem = 0;
  int cluster_y = 0;  // > 0: thread-block clusters of (1, cluster_y, 1) CTAs
};

// True when `kernel` as loaded for the current device waits in griddepcontrol (binary for sm_90 or later).
template <class Params>
bool has_grid_dependency_control(void (*kernel)(Params)) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // the launch itself reports a real problem
    return false;
  }
  return attr.binaryVersion >= 90;
}

template <class Params>
void launch_dit_kernel(void (*kernel)(Params), const LaunchShape& s, cudaStream_t stream, const Params& p) {
  const bool pdl = dit_switches().pdl && has_grid_dependency_control(kernel);
  if (!pdl && s.cluster_y == 0) {
    kernel<<<s.grid, s.block, s.smem, stream>>>(p);
    return;
  }
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (s.cluster_y > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1, attrs[n].val.clusterDim.y = s.cluster_y, attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = s.grid;
  config.blockDim = s.block;
  config.dynamicSmemBytes = s.smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  cudaLaunchKernelEx(&config, kernel, p);
}

}  // namespace flashmap::dit

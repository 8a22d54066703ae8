// The switches of the DiT kernels' newer code paths, read once from the environment (pure host code, no CUDA
// headers: python_tests/ops/test_cuda_host_math.py checks them on a CPU). Every path is OFF by default until
// it has passed the CUDA op tests on a GPU; the defaults are the kernels as validated on the H200.
//   FLASHMAP_DIT_CLUSTER_SPLITK=1   split-K linears reduce inside a thread-block cluster through distributed
//                                   shared memory (no global partials, no counters; <= 8 splits)
//   FLASHMAP_DIT_BATCHED_FIXUP=1    the last-CTA split-K fixup issues all of an element's split loads at once
//   FLASHMAP_DIT_LENGTH_SPLITS=1    attention merges only the key splits that hold keys (count from kv_len
//                                   on the device), not every split of the capacity
//   FLASHMAP_DIT_PARALLEL_MERGE=1   attention's split merge stages the weights in smem once per row and
//                                   issues the partial-output loads 8 at a time
//   FLASHMAP_DIT_PDL=1              programmatic dependent launch (sm_90+; dit_launch.cuh): each kernel may
//                                   start while its predecessor finishes; turns FLASHMAP_DIT_NODE_WORKSPACES
//                                   on (fixup_counters.h) and refuses FLASHMAP_DIT_NODE_WORKSPACES=0
//   FLASHMAP_LINEAR_MAX_SPLITS=n, FLASHMAP_LINEAR_CTAS_PER_SM=n   the split-K plan's caps (the split sweep)
// Read in Python (drafters/flashmap/fused.py, at pack time): FLASHMAP_DIT_PRECOMPUTED_MODS=1 and
// FLASHMAP_DIT_FUSED_NORMS=1 (the step calls the fused norm ops: linear_fused.cuh's kernel instantiations).
#pragma once

#include <cstdlib>
#include <cstring>

#include "dit/dit_tuning.h"

namespace flashmap::dit {

struct DitSwitches {
  bool cluster_splitk = false, batched_fixup = false, length_splits = false, parallel_merge = false;
  bool pdl = false;
  int max_splits = tuning::kLinearMaxSplits;      // 1..16
  int ctas_per_sm = tuning::kLinearCtasPerSm;     // 1..32
};

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

// FLASHMAP_DIT_PDL=1: programmatic dependent launch of every DiT kernel.
inline bool pdl_requested() { return env_flag("FLASHMAP_DIT_PDL"); }

// Every captured launch its own counter slice and workspace (fixup_counters.h): asked for, or implied by
// programmatic dependent launch, whose overlapping nodes must never share either.
inline bool node_workspaces_requested() { return env_flag("FLASHMAP_DIT_NODE_WORKSPACES") || pdl_requested(); }

// The one combination of switches that cannot run, as the error to raise; nullptr when there is none.
inline const char* switch_conflict() {
  if (pdl_requested() && env_is("FLASHMAP_DIT_NODE_WORKSPACES", "0"))
    return "FLASHMAP_DIT_PDL=1 needs per-node workspaces: unset FLASHMAP_DIT_NODE_WORKSPACES or set it to 1 "
           "(it is 0)";
  return nullptr;
}

// An integer in [lo, hi] from the environment, else `fallback` (unset, not a number, or out of range).
inline int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n >= lo && n <= hi) ? static_cast<int>(n) : fallback;
}

inline DitSwitches read_dit_switches() {
  DitSwitches s;
  s.cluster_splitk = env_flag("FLASHMAP_DIT_CLUSTER_SPLITK");
  s.batched_fixup = env_flag("FLASHMAP_DIT_BATCHED_FIXUP");
  s.length_splits = env_flag("FLASHMAP_DIT_LENGTH_SPLITS");
  s.parallel_merge = env_flag("FLASHMAP_DIT_PARALLEL_MERGE");
  s.pdl = pdl_requested();
  s.max_splits = env_int("FLASHMAP_LINEAR_MAX_SPLITS", tuning::kLinearMaxSplits, 1, tuning::kLinearMaxSplits);
  s.ctas_per_sm = env_int("FLASHMAP_LINEAR_CTAS_PER_SM", tuning::kLinearCtasPerSm, 1, 32);
  return s;
}

// The process's switches: read at the first launch (set the variables before the first DiT op runs).
inline const DitSwitches& dit_switches() {
  static const DitSwitches s = read_dit_switches();
  return s;
}

}  // namespace flashmap::dit

"""Host-side arithmetic of the CUDA launchers, compiled with the system C++ compiler and run on the CPU (no
CUDA needed): the linear split-K plan (csrc/dit/dit_plan.h) and verify's shared-memory opt-in
(csrc/verify/verify_smem.h). Expected values are worked out here from the documented hardware rules, not
from the code under test."""
import os
import subprocess

import pytest

from support.cxx_helpers import build_driver

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "dit/dit_plan.h"
#include "dit/dit_switches.h"
#include "verify/verify_smem.h"
int main(int argc, char** argv) {
  if (!std::strcmp(argv[1], "linear")) {
    flashmap::dit::LinearPlanCaps caps;
    if (argc > 7) caps = {atoi(argv[7]), atoi(argv[8]), atoi(argv[9]) != 0};
    auto p = flashmap::dit::linear_plan_for(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                                            caps);
    std::printf("%d %d %d %d %d %zu %zu %zu %d\n", p.tile_m, p.tile_n, p.tiles_m, p.tiles_n, p.splits,
                p.partial_floats, p.argmax_slots, p.counters, int(p.cluster));
  } else if (!std::strcmp(argv[1], "switches")) {
    const auto s = flashmap::dit::read_dit_switches();
    std::printf("%d %d %d %d %d %d\n", int(s.cluster_splitk), int(s.batched_fixup), int(s.length_splits),
                int(s.parallel_merge), s.max_splits, s.ctas_per_sm);
  } else {
    const long long vv = atoll(argv[2]);
    const size_t dyn = flashmap::verify_dynamic_smem_bytes(vv);
    std::printf("%zu %d %lld\n", dyn, int(flashmap::verify_needs_smem_optin(dyn, atoll(argv[3]))),
                (long long)flashmap::verify_max_vocab());
  }
}
"""
BLOCK_SCRATCH = 2592          # ptxas: static shared memory of verify_slot_kernel (sm_90a)
DEFAULT_SMEM = 48 * 1024      # a block's limit without cudaFuncSetAttribute (CUDA programming guide)
OPTIN_SMEM = 227 * 1024       # Hopper's per-block maximum after the opt-in


@pytest.fixture(scope="module")
def host_math(tmp_path_factory):
    exe = build_driver(tmp_path_factory, "host_math", DRIVER)

    def run(*args, env=None):
        done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, f"host_math {args} died with {done.returncode} (SIGFPE is -8)"
        return [int(v) for v in done.stdout.split()]
    return run


@pytest.mark.parametrize("M,N,argmax", [(0, 896, 0), (16, 0, 0), (0, 0, 1), (0, 151936, 1)])
def test_linear_plan_of_an_empty_product_is_empty(host_math, M, N, argmax):
    _, _, tiles_m, tiles_n, splits, partial, slots, counters, _ = host_math("linear", M, N, 896, argmax, 132)
    assert splits == 1 and tiles_m * tiles_n == 0 and (partial, slots, counters) == (0, 0, 0)


@pytest.mark.parametrize("M,N,K,argmax", [(16, 6144, 2048, 0), (17, 896, 896, 0), (100, 3584, 896, 0),
                                          (16, 151936, 896, 1), (1, 7, 64, 0)])
def test_linear_plan_covers_the_output_and_sizes_the_workspace(host_math, M, N, K, argmax):
    tile_m, tile_n, tiles_m, tiles_n, splits, partial, slots, counters, cluster = host_math("linear", M, N, K, argmax, 132)
    assert tiles_m == -(-M // tile_m) and tiles_n == -(-N // tile_n)
    assert 1 <= splits <= 16 and (splits == 1 or not argmax) and splits <= max(1, K // 64 // 2)
    assert partial == (splits * M * N if splits > 1 else 0)
    assert slots == (tiles_n * M if argmax else 0) and counters == tiles_m * tiles_n + tiles_m and cluster == 0


@pytest.mark.parametrize("M,N,K", [(16, 2048, 2048), (16, 2048, 8192), (16, 6144, 2048), (64, 896, 896)])
def test_cluster_split_k_plan_needs_no_workspace(host_math, M, N, K):
    """Drafter shapes (Qwen3-8B preset: width 2048, MLP 8192): at most 8 splits (the portable cluster), no
    partials, no counters; the default plan of the same shape is unchanged by the caps' defaults."""
    default = host_math("linear", M, N, K, 0, 132)
    assert default == host_math("linear", M, N, K, 0, 132, 16, 3, 0)
    *_, splits, partial, slots, counters, cluster = host_math("linear", M, N, K, 0, 132, 16, 3, 1)
    assert splits == min(default[4], 8) and 1 <= splits <= 8
    assert partial == 0 and counters == 0 and cluster == (splits > 1)
    tiles_m, tiles_n = -(-M // default[0]), -(-N // 128)
    argmax = host_math("linear", M, N, K, 1, 132, 16, 3, 1)  # the LM head keeps one split, its counters
    assert argmax[4:] == [1, 0, tiles_n * M, tiles_m * tiles_n + tiles_m, 0]


@pytest.mark.parametrize("max_splits,ctas", [(1, 3), (2, 3), (4, 3), (8, 1), (16, 6)])
def test_split_sweep_caps_bound_the_plan(host_math, max_splits, ctas):
    M, N, K = 16, 2048, 8192  # fc2: 16 column tiles, 128 K-tiles
    *_, splits, partial, _, _, _ = host_math("linear", M, N, K, 0, 132, max_splits, ctas, 0)
    assert splits == min(max_splits, -(-ctas * 132 // 16), 128 // 2)
    assert partial == (splits * M * N if splits > 1 else 0)


def test_switches_are_off_by_default_and_read_from_the_environment(host_math):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHMAP_DIT_", "FLASHMAP_LINEAR_"))}
    assert host_math("switches", env=clean) == [0, 0, 0, 0, 16, 3]
    on = dict(clean, FLASHMAP_DIT_CLUSTER_SPLITK="1", FLASHMAP_DIT_BATCHED_FIXUP="1", FLASHMAP_DIT_LENGTH_SPLITS="1",
              FLASHMAP_DIT_PARALLEL_MERGE="1", FLASHMAP_LINEAR_MAX_SPLITS="4", FLASHMAP_LINEAR_CTAS_PER_SM="2")
    assert host_math("switches", env=on) == [1, 1, 1, 1, 4, 2]
    odd = dict(clean, FLASHMAP_DIT_CLUSTER_SPLITK="yes", FLASHMAP_LINEAR_MAX_SPLITS="17",
               FLASHMAP_LINEAR_CTAS_PER_SM="2x")
    assert host_math("switches", env=odd) == [0, 0, 0, 0, 16, 3]  # only "1" turns a path on; bad numbers: defaults


def test_verify_smem_opt_in_counts_the_static_shared_memory(host_math):
    vocab = 1_000_000  # just under 1 M ids: 3907 tiles, 46,884 dynamic bytes
    dynamic, optin, _ = host_math("verify", vocab, BLOCK_SCRATCH)
    assert dynamic == 3 * -(-vocab // 256) * 4 and dynamic <= DEFAULT_SMEM < dynamic + BLOCK_SCRATCH
    assert optin == 1  # the old rule (dynamic > 48 KiB) skipped the opt-in and the launch failed
    assert host_math("verify", 151936, BLOCK_SCRATCH)[1] == 0  # 7,128 B: no opt-in needed
    dynamic, optin, max_vocab = host_math("verify", 0, BLOCK_SCRATCH)
    assert dynamic == 0 and optin == 0
    top = host_math("verify", max_vocab, BLOCK_SCRATCH)[0]
    assert top + BLOCK_SCRATCH <= OPTIN_SMEM and host_math("verify", max_vocab + 256, BLOCK_SCRATCH)[0] > top

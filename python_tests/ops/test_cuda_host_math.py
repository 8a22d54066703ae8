"""Host-side arithmetic of the CUDA launchers, compiled with the system C++ compiler and run on the CPU (no
CUDA needed): the linear split-K plan (csrc/dit/dit_plan.h) and verify's shared-memory opt-in
(csrc/verify/verify_smem.h). Expected values are worked out here from the documented hardware rules, not
from the code under test."""
import subprocess

import pytest

from support.cxx_helpers import build_driver

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "dit/dit_plan.h"
#include "verify/verify_smem.h"
int main(int argc, char** argv) {
  if (!std::strcmp(argv[1], "linear")) {
    auto p = flashmap::dit::linear_plan_for(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    std::printf("%d %d %d %d %d %zu %zu %zu\n", p.tile_m, p.tile_n, p.tiles_m, p.tiles_n, p.splits,
                p.partial_floats, p.argmax_slots, p.counters);
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

    def run(*args):
        done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        assert done.returncode == 0, f"host_math {args} died with {done.returncode} (SIGFPE is -8)"
        return [int(v) for v in done.stdout.split()]
    return run


@pytest.mark.parametrize("M,N,argmax", [(0, 896, 0), (16, 0, 0), (0, 0, 1), (0, 151936, 1)])
def test_linear_plan_of_an_empty_product_is_empty(host_math, M, N, argmax):
    _, _, tiles_m, tiles_n, splits, partial, slots, counters = host_math("linear", M, N, 896, argmax, 132)
    assert splits == 1 and tiles_m * tiles_n == 0 and (partial, slots, counters) == (0, 0, 0)


@pytest.mark.parametrize("M,N,K,argmax", [(16, 6144, 2048, 0), (17, 896, 896, 0), (100, 3584, 896, 0),
                                          (16, 151936, 896, 1), (1, 7, 64, 0)])
def test_linear_plan_covers_the_output_and_sizes_the_workspace(host_math, M, N, K, argmax):
    tile_m, tile_n, tiles_m, tiles_n, splits, partial, slots, counters = host_math("linear", M, N, K, argmax, 132)
    assert tiles_m == -(-M // tile_m) and tiles_n == -(-N // tile_n)
    assert 1 <= splits <= 16 and (splits == 1 or not argmax) and splits <= max(1, K // 64 // 2)
    assert partial == (splits * M * N if splits > 1 else 0)
    assert slots == (tiles_n * M if argmax else 0) and counters == tiles_m * tiles_n + tiles_m


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

"""Programmatic dependent launch of the DiT kernels (FLASHMAP_DIT_PDL; csrc/dit/dit_launch.cuh), host side,
compiled with the system C++ compiler against the CUDA toolkit's headers and a fake CUDA runtime (no GPU, no
torch): the switch is read from the environment and turns the per-node counter slices on (a node may start
while its predecessor still runs, so no two nodes of a graph may share counters), an explicit
FLASHMAP_DIT_NODE_WORKSPACES=0 is refused in one line naming both variables, and the counters of a captured
draft step's launches, at the Qwen3-8B drafter shape, are pairwise disjoint slices of the buffer. The
expected slices are checked as intervals here, not read back from the code under test. The kernels' side
(same tokens with it on, graph replayed 1000 times) runs on a GPU: test_dit_switches.py."""
import os
import pathlib
import re
import subprocess

import pytest

from support.cxx_helpers import build_driver, cuda_include

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "dit/dit_plan.h"
#include "dit/dit_switches.h"
#include "dit/fixup_counters.h"

static std::vector<void*> blocks;
extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes) { *p = std::calloc(bytes, 1); blocks.push_back(*p); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) { std::memset(p, v, bytes); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaFree(void*) { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
}

int main(int argc, char** argv) {
  using namespace flashmap::dit;
  if (!std::strcmp(argv[1], "switches")) {
    const char* conflict = switch_conflict();
    std::printf("%d %d\n%s\n", int(read_dit_switches().pdl), int(node_workspaces_enabled()),
                conflict ? conflict : "-");
    return 0;
  }
  // step CAPTURES NODE...: NODE = linear:M:N:K:ARGMAX (counters as the glue asks for them) or counters:N.
  std::vector<size_t> need;
  for (int i = 3; i < argc; ++i) {
    if (!std::strncmp(argv[i], "counters:", 9)) { need.push_back(std::strtoul(argv[i] + 9, nullptr, 10)); continue; }
    int M, N, K, argmax;
    std::sscanf(argv[i], "linear:%d:%d:%d:%d", &M, &N, &K, &argmax);
    const LinearPlan plan = linear_plan_for(M, N, K, argmax != 0, 132, LinearPlanCaps{});
    need.push_back(plan.counters > 0 && (plan.splits > 1 || argmax) ? plan.counters : 0);
  }
  CounterPool pool;  // the environment's mode
  size_t most = 0;
  for (size_t n : need) most = n > most ? n : most;
  pool.reserve(most, nullptr);  // the uncaptured warm-up
  const int* base = blocks.empty() ? nullptr : static_cast<int*>(blocks.back());
  for (int c = 1; c <= std::atoi(argv[2]); ++c)
    for (size_t n : need) {
      if (n == 0) continue;  // no fixup: the launch takes no counters
      const int* p = pool.for_capture(c, nullptr, n);
      std::printf("%d %ld %zu %zu\n", c, p ? long(p - base) : -1L, n, pool.size());
    }
  return 0;
}
"""
ROOT = pathlib.Path(__file__).resolve().parents[2]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHMAP_DIT_", "FLASHMAP_LINEAR_"))}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = build_driver(tmp_path_factory, "dit_pdl", DRIVER, "-Wall", "-I", str(cuda_include()))

    def run(*args, **env):
        done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env={**CLEAN, **env})
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()
    return run


def test_pdl_is_off_by_default_and_only_1_turns_it_on(driver):
    assert driver("switches") == ["0 0", "-"]
    for odd in ("0", "yes", "true", ""):
        assert driver("switches", FLASHMAP_DIT_PDL=odd) == ["0 0", "-"], odd
    assert driver("switches", FLASHMAP_DIT_NODE_WORKSPACES="1") == ["0 1", "-"]


def test_pdl_turns_the_node_workspaces_on(driver):
    assert driver("switches", FLASHMAP_DIT_PDL="1") == ["1 1", "-"]
    assert driver("switches", FLASHMAP_DIT_PDL="1", FLASHMAP_DIT_NODE_WORKSPACES="1") == ["1 1", "-"]


def test_pdl_with_node_workspaces_explicitly_off_is_refused_naming_both(driver):
    _, message = driver("switches", FLASHMAP_DIT_PDL="1", FLASHMAP_DIT_NODE_WORKSPACES="0")
    assert "FLASHMAP_DIT_PDL=1" in message and "FLASHMAP_DIT_NODE_WORKSPACES" in message
    # The glue raises it before its first launch (dit_cuda.cpp, the launch stream).
    glue = (ROOT / "csrc" / "dit" / "dit_cuda.cpp").read_text()
    body = glue[glue.index("cudaStream_t stream() {"):]
    assert "switch_conflict()" in body[:body.index("\n}\n")]


def qwen3_8b_step_nodes(evaluations: int = 1) -> list[str]:
    """The launches with fixup counters of a captured draft step of the Qwen3-8B drafter (6 layers, width
    2048, 16 heads of 128, MLP 8192, d_target 4096, cond 256, K = 16 slots, batch 1, vocabulary 151,936;
    drafters/flashmap/fused.py): the anchor entry and memory K/V, then per evaluation the slot projection, the
    adaLN modulations, per layer qkv / self out / q / cross attention over the memory (16 heads x 1 query tile
    of counters when it splits) / cross out / fc1 / fc2, the final linear and the LM head's argmax."""
    w, d, k = 2048, 4096, 16
    nodes = [f"linear:1:{w}:{d}:0", f"linear:1:{6 * 2 * w}:{w}:0"]
    for _ in range(evaluations):
        nodes += [f"linear:{k}:{w}:{d}:0", f"linear:1:{(9 * 6 + 2) * w}:256:0"]
        for _ in range(6):
            nodes += [f"linear:{k}:{3 * w}:{w}:0", f"linear:{k}:{w}:{w}:0", f"linear:{k}:{w}:{w}:0", "counters:16",
                      f"linear:{k}:{w}:{w}:0", f"linear:{k}:{4 * w}:{w}:0", f"linear:{k}:{w}:{4 * w}:0"]
        nodes += [f"linear:{k}:{d}:{w}:0", f"linear:{k}:151936:{d}:1"]
    return nodes


def slices(lines):
    return [tuple(int(v) for v in line.split()) for line in lines]


@pytest.mark.parametrize("evaluations", [1, 2])
def test_every_node_of_a_captured_step_gets_its_own_counters_under_pdl(driver, evaluations):
    nodes = qwen3_8b_step_nodes(evaluations)
    got = slices(driver("step", 2, *nodes, FLASHMAP_DIT_PDL="1"))
    per_capture = [[(off, n, size) for c, off, n, size in got if c == capture] for capture in (1, 2)]
    assert len(per_capture[0]) >= 30 * evaluations  # split-K linears, the argmax and the split attention
    assert per_capture[0] == per_capture[1]  # a later capture starts again at the buffer's start
    intervals = sorted((off, off + n) for off, n, _ in per_capture[0])
    size = per_capture[0][0][2]
    assert all(0 <= lo and hi <= size and lo % 32 == 0 for lo, hi in intervals)  # inside, 128-byte aligned
    assert all(a_hi <= b_lo for (_, a_hi), (b_lo, _) in zip(intervals, intervals[1:])), "slices overlap"


def test_without_pdl_every_node_shares_the_buffers_start(driver):
    """The default (a strictly ordered graph): one buffer, every node at its start, which is what would race
    under programmatic dependent launch."""
    got = slices(driver("step", 1, *qwen3_8b_step_nodes()))
    assert len(got) >= 30 and {off for _, off, _, _ in got} == {0}


def kernel_bodies() -> dict:
    """Every __global__ function of csrc/dit: its name and its body (to the matching brace)."""
    out = {}
    for path in sorted((ROOT / "csrc" / "dit").glob("*.cu*")):
        text = path.read_text()
        for m in re.finditer(r"__global__ void(?: __launch_bounds__\([^)]*\))? (\w+)\(", text):
            start = text.index("{", m.end())
            depth, i = 0, start
            while True:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            out[m.group(1)] = text[start:i + 1]
    return out


def test_every_dit_kernel_waits_for_its_predecessor_and_launches_through_launch_dit_kernel():
    """The grid wait is in every kernel (the linear's in its main loop, before the first x load), and no DiT
    launcher bypasses launch_dit_kernel: a new kernel without them would race under FLASHMAP_DIT_PDL=1."""
    bodies = kernel_bodies()
    assert {"linear_kernel", "attention_kernel", "adaln_kernel", "rms_norm_kernel", "kv_append_kernel"} <= set(bodies)
    linear = (ROOT / "csrc" / "dit" / "linear_kernel.cuh").read_text()
    loop = linear[linear.index("__device__ __forceinline__ void linear_mainloop("):]
    loop = loop[:loop.index("\n}\n")]
    assert loop.index("grid_dependency_wait();") < loop.index("load_rows<T>(gmem_copy, tXg")
    for name, body in bodies.items():
        waits = "grid_dependency_wait();" in body or (name == "linear_kernel" and "linear_mainloop<" in body)
        assert waits, f"{name} never calls grid_dependency_wait()"
        first_return = body.find("return;")
        if "grid_dependency_wait();" in body and first_return >= 0:
            assert body.index("grid_dependency_wait();") < first_return, f"{name} may exit before its wait"
    for path in (ROOT / "csrc" / "dit").glob("*.cu"):
        assert "<<<" not in path.read_text(), f"{path.name} launches without launch_dit_kernel"

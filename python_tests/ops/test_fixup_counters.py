"""The shared fixup counters of captured DiT launches (csrc/dit/fixup_counters.h; DESIGN.md §10), compiled
with the system C++ compiler against the CUDA toolkit's headers and a fake CUDA runtime defined here (no
GPU, no torch): the buffer comes from cudaMalloc — the header cannot reach torch's caching allocator, whose
graph pools (torch.compile reduce-overhead) would own it — is zeroed once per growth, is never freed, and
is handed only to captures it can serve. Expected values follow the documented policy (grow to
max(n, 2 x size); one stream per capture), not the code under test."""
import os
import pathlib
import re
import subprocess

import pytest

from support.cxx_helpers import build_driver, cuda_include

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Commands, one per argument: `reserve:N:S` (an uncaptured call needing N counters on stream S),
# `capture:ID:S:N` (a call captured on stream S), `fail` (the next cudaMalloc fails), `pool:D`.
DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "dit/fixup_counters.h"

struct Alloc { int* p; size_t bytes; bool zeroed; long synced_stream; bool freed; };
static std::vector<Alloc> allocs;
static bool fail_next = false;
static int frees_of_live = 0, errors_cleared = 0;
static long last_memset_stream = -1;

extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (fail_next) { fail_next = false; return cudaErrorMemoryAllocation; }
  int* mem = static_cast<int*>(std::malloc(bytes));
  std::memset(mem, 0x5a, bytes);  // garbage until zeroed
  allocs.push_back({mem, bytes, false, -1, false});
  *p = mem;
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  std::memset(p, value, bytes);
  for (Alloc& a : allocs) if (a.p == p) a.zeroed = value == 0 && bytes == a.bytes;
  last_memset_stream = reinterpret_cast<long>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  for (Alloc& a : allocs) if (a.zeroed && last_memset_stream == reinterpret_cast<long>(s)) a.synced_stream = long(s);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  for (Alloc& a : allocs) if (a.p == p) a.freed = true, ++frees_of_live;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { ++errors_cleared; return cudaSuccess; }
}

static cudaStream_t stream(const char* s) { return reinterpret_cast<cudaStream_t>(std::atol(s)); }
static int owner(const int* p) {  // which allocation p points into, -1 for nullptr
  for (size_t i = 0; i < allocs.size(); ++i)
    if (p >= allocs[i].p && p < allocs[i].p + allocs[i].bytes / sizeof(int)) return int(i);
  return p ? -2 : -1;
}

int main(int argc, char** argv) {
  const bool nodes = std::strcmp(argv[1], "nodes") == 0;  // per-node slices (FLASHMAP_DIT_NODE_WORKSPACES=1)
  flashmap::dit::CounterPool pool(nodes || std::strcmp(argv[1], "on") == 0, nodes);
  for (int i = 2; i < argc; ++i) {
    char* f[5] = {};
    int nf = 0;
    for (char* t = std::strtok(argv[i], ":"); t && nf < 5; t = std::strtok(nullptr, ":")) f[nf++] = t;
    if (!std::strcmp(f[0], "fail")) { fail_next = true; continue; }
    if (!std::strcmp(f[0], "pool")) {
      const int d = std::atoi(f[1]);
      auto* p = flashmap::dit::counter_pool(d);
      const bool distinct = !p || d == 0 || p != flashmap::dit::counter_pool(d - 1);
      std::printf("pool %d %d %d %d\n", p != nullptr, p == flashmap::dit::counter_pool(d), distinct,
                  p && p->reserve(1, nullptr) == cudaSuccess && p->for_capture(1, nullptr, 1) != nullptr);
      continue;
    }
    if (!std::strcmp(f[0], "reserve")) {
      const int rc = int(pool.reserve(std::strtoul(f[1], nullptr, 10), stream(f[2])));
      const Alloc* a = allocs.empty() ? nullptr : &allocs.back();
      std::printf("reserve rc=%d allocs=%zu bytes=%zu zeroed=%d synced=%ld size=%zu\n", rc, allocs.size(),
                  a ? a->bytes : 0, a ? int(a->zeroed) : 0, a ? a->synced_stream : -1, pool.size());
    } else {
      const int* p = pool.for_capture(std::strtoull(f[1], nullptr, 10), stream(f[2]), std::strtoul(f[3], nullptr, 10));
      const int o = owner(p);
      if (nodes && o >= 0) std::printf("capture %d +%ld\n", o, long(p - allocs[o].p));
      else std::printf("capture %d\n", o);
    }
  }
  std::printf("end frees=%d cleared=%d\n", frees_of_live, errors_cleared);
}
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    # No torch include path and no torch library: the header cannot use torch's allocator.
    exe = build_driver(tmp_path_factory, "fixup_counters", DRIVER, "-Wall", "-I", str(cuda_include()))

    def run(*commands, enabled=True, nodes=False, env=None):
        mode = "nodes" if nodes else "on" if enabled else "off"
        done = subprocess.run([str(exe), mode, *commands], capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()
    return run


def fields(line: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", line)}


def test_growth_is_one_zeroed_cuda_malloc_synced_on_the_calling_stream(pool):
    out = pool("reserve:100:7", "reserve:50:7", "reserve:100:3", "reserve:150:3", "reserve:1000:3")
    first, small, same, double, big, end = out
    assert fields(first) == dict(rc=0, allocs=1, bytes=400, zeroed=1, synced=7, size=100)
    assert fields(small)["allocs"] == 1 and fields(same)["allocs"] == 1  # big enough: nothing new
    assert fields(double) == dict(rc=0, allocs=2, bytes=800, zeroed=1, synced=3, size=200)  # 2 x 100 > 150
    assert fields(big) == dict(rc=0, allocs=3, bytes=4000, zeroed=1, synced=3, size=1000)  # n > 2 x 200
    assert fields(end)["frees"] == 0  # graphs captured earlier hold the old buffers


def test_a_capture_gets_the_newest_buffer_when_it_is_large_enough(pool):
    out = pool("capture:1:5:10", "reserve:100:5", "capture:2:5:100", "capture:3:5:101", "reserve:300:5",
               "capture:4:5:101", "capture:2:5:60")
    # nothing reserved yet; fits; one too many; the newer buffer; a capture seen before, on its stream
    assert [line for line in out if line.startswith("capture")] == \
        ["capture -1", "capture 0", "capture -1", "capture 1", "capture 1"]


def test_a_forked_capture_shares_on_its_first_stream_only(pool):
    out = pool("reserve:64:1", "capture:9:1:8", "capture:9:2:8", "capture:9:1:8", "capture:10:2:8",
               "capture:9:2:8")
    assert [line for line in out if line.startswith("capture")] == \
        ["capture 0", "capture -1", "capture 0", "capture 0", "capture -1"]


def test_a_failed_growth_keeps_the_old_buffer_and_clears_the_error(pool):
    out = pool("reserve:16:1", "fail", "reserve:64:1", "capture:1:1:16", "capture:2:1:64")
    ok, failed, fits, too_big, end = out
    assert fields(ok)["rc"] == 0
    assert fields(failed)["rc"] == 2 and fields(failed)["allocs"] == 1 and fields(failed)["size"] == 16
    assert fits == "capture 0" and too_big == "capture -1"
    assert fields(end) == dict(frees=0, cleared=1)


def test_sharing_off_never_allocates_and_never_shares(pool):
    out = pool("reserve:100:1", "capture:1:1:10", enabled=False)
    assert fields(out[0])["allocs"] == 0 and out[1] == "capture -1"


def test_one_pool_per_device_and_the_environment_switch(pool):
    assert pool("pool:0", "pool:1", "pool:63")[:3] == ["pool 1 1 1 1"] * 3  # exists, stable, distinct, shares
    assert pool("pool:64", "pool:-1")[:2] == ["pool 0 1 1 0"] * 2
    assert pool("pool:1", env={"FLASHMAP_SHARED_COUNTERS": "0"})[0] == "pool 1 1 1 0"


def test_the_cuda_glue_takes_captured_counters_from_the_pool_only():
    """The counters' torch side (common/fixup_counters_glue.h, used by the DiT and verify glue) hands
    captured launches the pool's buffer, and its only at::zeros is the fresh per-call tensor (the old
    never-freed buffer came from at::zeros, i.e. the caching allocator)."""
    glue = (ROOT / "csrc" / "common" / "fixup_counters_glue.h").read_text()
    assert '#include "dit/fixup_counters.h"' in glue
    for user in ("dit/dit_cuda.cpp", "verify/verify_cuda.cpp"):
        assert '#include "common/fixup_counters_glue.h"' in (ROOT / "csrc" / user).read_text()
    body = glue[glue.index("Counters fixup_counters("):]
    body = body[:body.index("\n}\n")]
    assert "counter_pool(" in body and "for_capture(" in body and "reserve(" in body
    assert len(re.findall(r"at::(zeros|empty)\(", body)) == 1 and "at::Tensor fresh = at::zeros(" in body
    assert "static" not in body  # no buffer of torch's kept across calls


def test_per_node_mode_gives_every_captured_launch_its_own_slice(pool):
    """FLASHMAP_DIT_NODE_WORKSPACES=1: the buffer holds at least 2^16 counters; within one capture every launch
    gets the next 128-byte aligned slice (distinct, in order); a new capture starts again at 0; a launch that
    no longer fits falls back to fresh counters; a forked stream still never shares."""
    out = pool("reserve:10:1", "capture:1:1:10", "capture:1:1:33", "capture:1:1:1", "capture:2:1:5",
               "capture:1:2:1", "capture:3:1:65536", "capture:3:1:1", nodes=True)
    grew, *captures, _ = out
    assert fields(grew) == dict(rc=0, allocs=1, bytes=4 * 2 ** 16, zeroed=1, synced=1, size=2 ** 16)
    assert captures == ["capture 0 +0", "capture 0 +32", "capture 0 +96", "capture 0 +0", "capture -1",
                        "capture 0 +0", "capture -1"]

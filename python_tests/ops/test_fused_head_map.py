"""The index arithmetic of the fused linear's head epilogues (csrc/dit/head_map.h; FLASHMAP_DIT_FUSED_NORMS),
compiled with the system C++ compiler and run on the CPU: a driver walks the tiles, the row slices of a
cluster split-K and the head vectors exactly as linear_fused.cuh does, and prints where each vector goes.
Expected destinations come from torch views of the unfused layouts (the qkv output [M, 3, H, D], the mem_kv
output [B, T, n_layers, 2, H, D] and the memory caches viewed as [n_layers, B, L, H, D]), not from the header."""
import subprocess

import pytest
import torch

from support.cxx_helpers import build_driver

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "dit/head_map.h"
using namespace flashmap::dit;
// Every head vector of an M x N output, visited as the kernel does: 128-column tiles, rows split over `ranks`.
template <class Dest>
void walk(int M, int N, int D, int ranks, const Dest& dest) {
  for (int n0 = 0; n0 < N; n0 += 128) {
    const int nn = N - n0 < 128 ? N - n0 : 128, per_row = nn / D;
    for (int rank = 0; rank < ranks; ++rank) {
      const Slice rows = rank_slice(rank, ranks, M);
      for (int v = 0; v < (rows.end - rows.begin) * per_row; ++v) {
        const TileHead h = tile_head(v, per_row, rows.begin, n0, D);
        const HeadDest d = dest(h.m, h.gh);
        std::printf("%d %d %d %lld %d %d %d %lld\n", h.m, h.gh, n0 + h.c0, (long long)d.offset, d.norm, d.cache,
                    int(d.rope), (long long)d.position);
      }
    }
  }
}
int main(int argc, char** argv) {
  auto arg = [&](int i) { return atoi(argv[i]); };
  if (!std::strcmp(argv[1], "norm")) {  // M N D heads has_k rope ranks
    const int N = arg(3), D = arg(4), heads = arg(5);
    const bool has_k = arg(6), rope = arg(7);
    walk(arg(2), N, D, arg(8), [&](int gm, int gh) {
      return head_norm_dest(gm, gh, N, D, heads, has_k, rope, 1000 + gm); });
  } else {  // kv B T layers H D L strides(layer batch row head) ranks start[B] count[B]
    const int B = arg(2), T = arg(3), layers = arg(4), H = arg(5), D = arg(6);
    const CacheGeometry g{T, arg(7), H, atoll(argv[8]), atoll(argv[9]), atoll(argv[10]), atoll(argv[11])};
    std::vector<int> start(B), count(B);
    for (int b = 0; b < B; ++b) start[b] = arg(13 + b), count[b] = arg(13 + B + b);
    walk(B * T, layers * 2 * H * D, D, arg(12), [&](int gm, int gh) {
      return kv_append_dest(gm, gh, g, start[gm / T], count[gm / T]); });
  }
}
"""


@pytest.fixture(scope="module")
def head_map(tmp_path_factory):
    exe = build_driver(tmp_path_factory, "head_map", DRIVER)

    def run(*args):
        done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, check=True)
        return [tuple(int(v) for v in line.split()) for line in done.stdout.splitlines()]
    return run


def visited_once(rows, M, N, D):
    """Every (row, head) of an M x N output exactly once, at its own columns."""
    seen = sorted((gm, gh) for gm, gh, col, *_ in rows)
    assert seen == [(gm, gh) for gm in range(M) for gh in range(N // D)], "a head vector missed or visited twice"
    assert all(col == gh * D for _, gh, col, *_ in rows), "a vector read from another head's columns"


@pytest.mark.parametrize("M,H,D,groups,has_k,rope,ranks", [
    (16, 16, 128, 3, True, False, 1), (16, 16, 128, 1, False, True, 1), (48, 14, 64, 3, True, False, 3),
    (5, 2, 64, 3, True, True, 8), (64, 4, 32, 1, False, True, 2)])
def test_head_norm_vectors_go_to_their_qkv_columns_with_their_norm(head_map, M, H, D, groups, has_k, rope, ranks):
    N = groups * H * D
    rows = head_map("norm", M, N, D, H, int(has_k), int(rope), ranks)
    visited_once(rows, M, N, D)
    qkv = torch.arange(M * N).view(M, groups, H, D)  # the unfused view of the linear's output
    for gm, gh, _, offset, norm, _, row_rope, position in rows:
        group, h = divmod(gh, H)
        assert offset == qkv[gm, group, h, 0]
        want_norm = 0 if group == 0 else 1 if group == 1 and has_k else -1  # q_norm, k_norm, or the values
        assert norm == want_norm
        assert bool(row_rope) == (rope and want_norm >= 0) and (not row_rope or position == 1000 + gm)


@pytest.mark.parametrize("B,T,layers,H,D,L,start,count,ranks", [
    (1, 1, 6, 16, 128, 40, [39], [1], 1), (3, 5, 2, 2, 64, 12, [8, -2, 0], [5, 5, 3], 4),
    (2, 17, 3, 4, 32, 64, [10, 50], [17, 17], 8), (1, 4, 1, 1, 128, 3, [0], [4], 1)])
def test_kv_append_vectors_go_to_their_cache_rows(head_map, B, T, layers, H, D, L, start, count, ranks):
    cache = torch.arange(layers * B * H * L * D).view(layers, B, H, L, D).transpose(2, 3)  # memory.k.transpose(2, 3)
    strides = [cache.stride(i) for i in range(4)]
    rows = head_map("kv", B, T, layers, H, D, L, *strides, ranks, *start, *count)
    N = layers * 2 * H * D
    visited_once(rows, B * T, N, D)
    y = torch.arange(B * T * N).view(B, T, layers, 2, H, D)  # the unfused view of the mem_kv output
    where = {}
    for b, t, layer, part, h in torch.cartesian_prod(*map(torch.arange, (B, T, layers, 2, H))).tolist():
        flat = int(y[b, t, layer, part, h, 0])
        where[(flat // N, flat % N // D)] = (b, t, layer, part, h)
    for gm, gh, _, offset, norm, which, rope, position in rows:
        b, t, layer, part, h = where[(gm, gh)]
        row = start[b] + t
        if t >= count[b] or not 0 <= row < L:
            assert offset == -1, f"row {row} of batch row {b} must be dropped"
            continue
        assert (offset, which) == (int(cache[layer, b, row, h, 0]), part)
        assert (norm, bool(rope)) == ((layer, True) if part == 0 else (-1, False))  # keys: their layer's norm, RoPE
        assert not rope or position == row

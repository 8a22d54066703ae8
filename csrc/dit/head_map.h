// Where the head epilogues of the fused linear (linear_fused.cuh, FLASHMAP_DIT_FUSED_NORMS) send each head
// vector of a tile: pure index arithmetic for host and device, so it is tested on a CPU
// (python_tests/ops/test_fused_head_map.py) against the layouts the unfused ops use.
//   A tile of nn <= 128 columns starting at n0 holds nn / D whole heads (D divides 128 and N); its rows
//   [r0, r1) give (r1 - r0) * nn / D vectors, vector v = (row r0 + v / (nn / D), head (n0 + c0) / D).
//   kHeadNorm: y [M, N]; heads [0, heads) are queries (q_norm), [heads, 2 heads) keys (k_norm, when given),
//   the rest are copied; RoPE (when positions are given) on the normed heads.
//   kKvAppend: row gm = (b, t) of B x T entries; head gh = (layer, keys or values, h) of the per-layer
//   [2, H, D] projection; written to cache row start[b] + t when t < count[b] and the row lies in [0, L).
#pragma once

#include <cstdint>

#include "dit/split_reduce.h"  // FLASHMAP_HD

namespace flashmap::dit {

struct TileHead {
  int m, c0, gh;  // tile row, first column in the tile, global head index
};

FLASHMAP_HD TileHead tile_head(int v, int heads_per_row, int r0, int n0, int D) {
  const int c0 = (v % heads_per_row) * D;
  return {r0 + v / heads_per_row, c0, (n0 + c0) / D};
}

struct HeadDest {
  int64_t offset;  // element offset of the vector's first element in its destination; -1: dropped
  int norm;        // -1: copied as is; else the norm: 0 q_norm / 1 k_norm (kHeadNorm), the layer (kKvAppend)
  int cache;       // kKvAppend: 0 k_cache, 1 v_cache
  bool rope;        // RoPE at `position`
  int64_t position;
};

// rope: positions were given (position = positions[gm]).
FLASHMAP_HD HeadDest head_norm_dest(int gm, int gh, int N, int D, int heads, bool has_k_norm, bool rope,
                                    int64_t position) {
  const int group = gh / heads;
  const int norm = group == 0 ? 0 : (group == 1 && has_k_norm) ? 1 : -1;
  return {static_cast<int64_t>(gm) * N + static_cast<int64_t>(gh) * D, norm, 0, rope && norm >= 0, position};
}

struct CacheGeometry {
  int T, L, H;                              // entries per batch row, cache rows, heads per layer
  int64_t layer, batch, row, head;          // element strides of the [n_layers, B, L, H, D] caches
};

// The cache row (and RoPE position) of entry row gm = (b, t): start[b] + t; start_b = start[gm / T].
FLASHMAP_HD int kv_append_row(int gm, int T, int start_b) { return start_b + gm % T; }

// start_b / count_b: start[b] and count[b] of the row's batch row b = gm / T.
FLASHMAP_HD HeadDest kv_append_dest(int gm, int gh, const CacheGeometry& g, int start_b, int count_b) {
  const int b = gm / g.T, t = gm % g.T, row = kv_append_row(gm, g.T, start_b);
  if (t >= count_b || row < 0 || row >= g.L) return {-1, -1, 0, false, 0};
  const int layer = gh / (2 * g.H), is_v = (gh / g.H) % 2, head = gh % g.H;
  const int64_t offset = layer * g.layer + b * g.batch + row * g.row + head * g.head;
  return {offset, is_v ? -1 : layer, is_v, !is_v, row};
}

}  // namespace flashmap::dit

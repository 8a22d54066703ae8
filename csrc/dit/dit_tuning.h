// Every tuning constant of the DiT kernels, in one place, with the reason for each value. Targets: H100 /
// H200 (132 SMs, 228 KB smem per SM, 50-60 MB L2, 3.3-4.8 TB/s HBM). At the drafter's shapes (M = B*K <= 64
// rows) every GEMM is a weight stream: the goal is enough bytes in flight per SM, not tensor-core rate.
#pragma once

namespace flashmap::dit::tuning {

// ---- Linear (swap-AB GEMM: the weight is the MMA's M side, the <= 64 tokens are its N side). ------
// 128 output features per CTA: four warps of 2 x m16 each; a 128 x 64 bf16 weight stage is 16 KB.
constexpr int kLinearTileN = 128;
// Token tiles: 16 covers the common B*K = 16 with no wasted MMA columns; 64 covers M <= 64 in one tile so
// the weight is streamed once (M > 64 loops over token tiles in the grid and re-reads weights from L2).
constexpr int kLinearSmallTileM = 16;
constexpr int kLinearLargeTileM = 64;
// 64 bf16 = 128 bytes of K per stage: one 128-byte swizzle row, the natural cp.async/ldmatrix unit.
constexpr int kLinearTileK = 64;
// 4 stages x 18 KB (tile_m 16) = 72 KB -> 3 CTAs per SM -> ~9 weight stages (144 KB) in flight per SM,
// well above the ~40 KB per SM Little's law asks for at 4.8 TB/s and ~1 us latency.
constexpr int kLinearStages = 4;
constexpr int kLinearThreads = 128;
// Split-K: aim for this many CTAs per SM (the resident count above) so the weight stream is spread over
// the whole chip even for N = 2048 (16 tiles); each split keeps >= 2 K-tiles so its pipeline still
// overlaps, and at most 16 splits so the fp32 partials (splits x M x N) stay small and L2-resident.
constexpr int kLinearCtasPerSm = 3;
constexpr int kLinearMinKTilesPerSplit = 2;
constexpr int kLinearMaxSplits = 16;

// ---- Attention (flash-decoding: one CTA per (batch, head, key split, 16-query tile)). --------------
// One m16 MMA row block of queries: the drafter has K = 16 slots per batch row.
constexpr int kAttnQueriesPerTile = 16;
// Four warps; each takes 16 keys of a 64-key block (one m16n8k16 K-step of P.V), then the four online
// softmax states are merged through smem at the end of the CTA's key range.
constexpr int kAttnWarps = 4;
constexpr int kAttnKeysPerBlock = 16 * kAttnWarps;
// Two K/V smem stages (2 x 2 x 64 x (128 + 8) x 2 B = 70 KB at D = 128): one loading while one computes.
constexpr int kAttnStages = 2;
// +8 bf16 (16 bytes) per smem row: consecutive rows land on different banks for ldmatrix and 32-bit loads.
constexpr int kAttnRowPad = 8;
// Splits over keys: target 2 CTAs per SM, each split at least 2 key blocks (128 keys) so the fixed cost of
// the merge stays small relative to the streamed K/V; at most 64 splits (partials stay tiny).
constexpr int kAttnCtasPerSm = 2;
constexpr int kAttnMinBlocksPerSplit = 2;
constexpr int kAttnMaxSplits = 64;

// ---- adaLN, RMSNorm and cache append: one warp per row (vector), 16-byte vectors; bandwidth-trivial at M <= 64. -------
constexpr int kNormWarpsPerCta = 4;
constexpr int kAppendThreads = 128;

}  // namespace flashmap::dit::tuning

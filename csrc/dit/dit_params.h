// Params structs and launchers of the fused DiT-block kernels (DESIGN.md §5, §10). Device code sees only
// these: raw pointers, element strides and sizes, never torch types. The torch glue (dit_cuda.cpp)
// validates tensors, fills a struct, allocates the workspace a plan asks for and launches on the current
// stream. All activations and weights are bf16 (stored as uint16_t here so this header needs no CUDA
// type headers); accumulation and statistics are fp32. Strides are in elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "dit/dit_plan.h"

namespace flashmap::dit {

using bf16_bits = uint16_t;  // raw bf16 storage (cutlass::bfloat16_t / __nv_bfloat16 in the kernels)

// Streaming multiprocessors of `device` (cached): the split heuristics size grids to the whole chip.
int sm_count(int device);

// ---- adaLN: out = LayerNorm(x) * (1 + scale) + shift, LayerNorm without affine. ----------------------
struct AdaLNParams {
  const bf16_bits* x;      // [M, N], row stride x_stride
  const bf16_bits* shift;  // [G, N], row stride shift_stride; row m uses row m / rows_per_cond
  const bf16_bits* scale;  // [G, N], row stride scale_stride
  bf16_bits* out;          // [M, N], contiguous
  int64_t x_stride, shift_stride, scale_stride;
  int M, N, rows_per_cond;
  float eps;
};
void adaln_launch(const AdaLNParams& p, cudaStream_t stream);

// ---- RMSNorm per head (weight [D]) with optional rotate-half RoPE at each row's absolute position. ------
struct RmsNormParams {
  const bf16_bits* x;        // [M, H, D], strides (x_row, x_head), last dim contiguous
  const bf16_bits* weight;   // [D]
  const int64_t* positions;  // [M] or nullptr (no RoPE)
  bf16_bits* out;            // [M, H, D] contiguous
  int64_t x_row, x_head;
  int M, H, D;
  float theta, eps;
};
void rms_norm_launch(const RmsNormParams& p, cudaStream_t stream);

// ---- Linear: out = residual + gate * act(x @ W^T + bias), or the LM-head argmax. ---------------------
enum class Activation : int { kNone = 0, kGeluTanh = 1, kSilu = 2 };

// The fused norms of a linear (FLASHMAP_DIT_FUSED_NORMS; linear_fused.cuh). The launcher picks the kernel
// instantiation from LinearParams::adaln_prologue and ::epilogue; all-zero = the plain linear.
enum class LinearEpilogue : int {
  kStore = 0,     // out = residual + gate * act(y + bias)
  kHeadNorm = 1,  // out = act(y + bias), then per row the leading `heads` query heads (norm q_norm) and the
                  // next `heads` key heads (k_norm, if set) RMS-normed, RoPE at positions[m] if set
  kKvAppend = 2,  // row m = (b, t): per layer, H key heads (norm kv_norm[layer], RoPE at start[b] + t) and H
                  // value heads written to k_cache / v_cache row start[b] + t if t < count[b] and in [0, L)
};

struct LinearFusion {
  // adaLN prologue: x rows LayerNorm-ed (no affine) and modulated, row m by shift/scale row m / rows_per_cond.
  const bf16_bits* shift;
  const bf16_bits* scale;
  int64_t shift_stride, scale_stride;
  int rows_per_cond;
  float adaln_eps;
  // Head epilogues: head_dim divides the 128-column tile, so a tile holds whole heads.
  int head_dim, heads;
  float theta, eps;
  const bf16_bits* q_norm;    // [head_dim] (kHeadNorm)
  const bf16_bits* k_norm;    // [head_dim] or nullptr (kHeadNorm)
  const int64_t* positions;   // [M] or nullptr (kHeadNorm)
  bf16_bits* k_cache;         // [n_layers, B, L, H, D] (kKvAppend; v_cache has the same strides)
  bf16_bits* v_cache;
  const bf16_bits* kv_norm;   // [n_layers, head_dim] contiguous
  const int* start;           // [B]
  const int* count;           // [B]
  int64_t cache_layer, cache_batch, cache_row, cache_head;
  int T, L;                   // new rows per batch row (M = B * T), cache rows
};

struct LinearParams {
  const bf16_bits* x;         // [M, K], row stride x_stride (multiple of 8, 16-byte aligned base)
  const bf16_bits* w;         // [N, K], row stride w_stride (nn.Linear layout = K-major, as packed)
  const bf16_bits* bias;      // [N] or nullptr
  const bf16_bits* gate;      // [G, N] (row stride gate_stride; row m uses m / rows_per_gate) or nullptr
  const bf16_bits* residual;  // [M, N] (row stride residual_stride) or nullptr
  bf16_bits* out;             // [M, N] contiguous (unused in argmax mode)
  int64_t x_stride, w_stride, gate_stride, residual_stride;
  int M, N, K, rows_per_gate;
  Activation act;
  // Argmax mode (LM head): tokens[m] = argmax_{n < valid_n} softcap(y[m, n]); logits (fp32 [M, N]) when
  // non-null. Lowest index wins ties, NaN wins over numbers (as torch.argmax).
  bool argmax;
  int valid_n;
  float softcap;        // 0 = off, else y = softcap * tanh(y / softcap)
  int64_t* tokens;      // [M]
  float* logits;        // [M, N] or nullptr
  // Workspace from linear_plan (fp32 split-K partials, per-tile argmax partials, zeroed counters).
  float* partials;      // [splits, M, N] when splits > 1
  float* argmax_val;    // [tiles_n, M] in argmax mode
  int* argmax_idx;      // [tiles_n, M] in argmax mode
  int* counters;        // [tiles_n * tiles_m + tiles_m], zero on entry (the kernel leaves them zero)
  int splits;
  bool cluster_splitk;  // the splits of a tile are one cluster (LinearPlan::cluster): no partials/counters
  bool batched_fixup;   // the last-CTA fixup issues all split loads of an element at once
  bool pdl;             // launched with programmatic dependent launch: weight stages before the grid wait
  // Fused norms (FLASHMAP_DIT_FUSED_NORMS): the adaLN prologue and a head epilogue; off when zero.
  bool adaln_prologue;
  LinearEpilogue epilogue;
  LinearFusion fuse;
};

LinearPlan linear_plan(int M, int N, int K, bool argmax, int device);
void linear_launch(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream);

// ---- Attention: out[b, i, h] = softmax_j(scale * q[b, i, h] . k[b, j, hk]) v[b, j, hk], j < kv_len[b]. --
struct AttentionParams {
  const bf16_bits* q;  // [B, Sq, Hq, D], strides (q_batch, q_row, q_head), last dim contiguous
  const bf16_bits* k;  // [B, Skv, Hkv, D], strides (k_batch, k_row, k_head)
  const bf16_bits* v;  // [B, Skv, Hkv, D], strides (v_batch, v_row, v_head)
  const int* kv_len;   // [B] valid keys per batch row (clamped to [0, Skv]), or nullptr = Skv
  bf16_bits* out;      // [B, Sq, Hq, D] contiguous
  int64_t q_batch, q_row, q_head, k_batch, k_row, k_head, v_batch, v_row, v_head;
  int B, Sq, Skv, Hq, Hkv, D;
  float scale;
  // Flash-decoding split over keys (from attention_plan): per split fp32 partial outputs + log2-sum-exp.
  float* partial_o;    // [B, Hq, splits, Sq, D] when splits > 1
  float* partial_lse;  // [B, Hq, splits, Sq]
  int* counters;       // [B * Hq * q_tiles], zero on entry (the kernel leaves them zero)
  int splits, keys_per_split;
  bool length_splits;   // only the splits holding keys (active_splits of kv_len) run, arrive and merge
  bool parallel_merge;  // the merge stages its weights in smem and batches the partial-output loads
};

struct AttentionPlan {
  int q_tiles, splits, keys_per_split;
  size_t partial_o_floats, partial_lse_floats, counters;
};
AttentionPlan attention_plan(int B, int Sq, int Skv, int Hq, int D, int device);
void attention_launch(const AttentionParams& p, const AttentionPlan& plan, cudaStream_t stream);
bool attention_supports_head_dim(int D);

// ---- Memory cache append: cache[b, start[b] + t] = values[b, t] for t < count[b] (rows outside the
// cache dropped).
struct KvAppendParams {
  bf16_bits* cache;         // [B, Lmax, H, D], strides (cache_batch, cache_row, cache_head)
  const bf16_bits* values;  // [B, T, H, D], strides (values_batch, values_row, values_head)
  const int* start;         // [B]
  const int* count;         // [B]
  int64_t cache_batch, cache_row, cache_head, values_batch, values_row, values_head;
  int B, T, Lmax, H, D;
};
void kv_append_launch(const KvAppendParams& p, cudaStream_t stream);

}  // namespace flashmap::dit

// CUDA glue of the DiT drafter ops: validate (dit_args.h, shared with CPU, plus the layout the kernels
// need), build the params struct, allocate outputs and workspace through the caching allocator (CUDA-graph
// safe; the shared fixup counters of captured launches excepted: fixup_counters.h), launch on the current
// stream. No math here: kernels live in norm.cu, linear.cu, attention.cu.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <utility>
#include <vector>

#include "dit/dit_args.h"
#include "dit/dit_fused_args.h"
#include "dit/dit_ops.h"
#include "dit/dit_params.h"
#include "common/fixup_counters_glue.h"
#include "dit/dit_switches.h"
#include "dit/fixup_counters.h"

namespace flashmap::dit {
namespace {

void expect_cuda_bf16(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device().str());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kBFloat16, op, ": ", name, " must be bfloat16 on CUDA, got ",
                   c10::toString(t.scalar_type()));
}

// The kernels read rows as 16-byte vectors (cp.async, uint4): last dim contiguous, every other stride a
// multiple of 8 elements, start 16-byte aligned, last dim a multiple of 8.
void expect_vector_rows(const at::Tensor& t, const char* op, const char* name) {
  bool ok = t.stride(-1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.size(-1) % 8 == 0;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) ok = ok && (t.stride(d) % 8 == 0 || t.size(d) == 1);
  TORCH_CHECK_VALUE(ok, op, ": on CUDA, ", name, " needs a contiguous last dim that is a multiple of 8, other "
                    "strides that are multiples of 8 elements and a 16-byte aligned start; got sizes ",
                    dims_str(t.sizes()), ", strides ", dims_str(t.strides()), " (call .contiguous())");
}

void expect_unit_stride(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.stride(-1) == 1, op, ": on CUDA, ", name, " needs a contiguous last dim, got strides ",
                    dims_str(t.strides()));
}

const bf16_bits* bf(const at::Tensor& t) { return static_cast<const bf16_bits*>(t.data_ptr()); }
const bf16_bits* bf(const std::optional<at::Tensor>& t) { return t ? bf(*t) : nullptr; }
bf16_bits* bf_mut(const at::Tensor& t) { return static_cast<bf16_bits*>(t.data_ptr()); }
// The current stream, which every op launches on; first refuses switches that cannot run together.
cudaStream_t stream() {
  static const char* conflict = switch_conflict();
  TORCH_CHECK_VALUE(conflict == nullptr, conflict);
  return c10::cuda::getCurrentCUDAStream().stream();
}

// FLASHMAP_DIT_NODE_WORKSPACES=1 or FLASHMAP_DIT_PDL=1 (fixup_counters.h): a captured launch's workspace tensors stay allocated until
// kHeld later captures have begun, so the caching allocator never hands them to a later node of the same graph
// (two nodes that may overlap under programmatic dependent launch never share a workspace).
void hold_for_capture(std::initializer_list<at::Tensor> tensors) {
  static const bool on = node_workspaces_enabled();
  if (!on) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream(), &capture, &id));
  if (capture != cudaStreamCaptureStatusActive) return;
  constexpr int kHeld = 8;
  static std::mutex mu;
  // Never destroyed: freeing tensors from a static destructor could outlive the CUDA caching allocator.
  static auto* held = new std::pair<unsigned long long, std::vector<at::Tensor>>[kHeld];
  static int next = 0;
  const std::lock_guard<std::mutex> lock(mu);
  auto* slot = std::find_if(held, held + kHeld, [&](const auto& h) { return h.first == id && !h.second.empty(); });
  if (slot == held + kHeld) {
    slot = &held[next];
    next = (next + 1) % kHeld;
    *slot = {id, {}};
  }
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.numel() > 0) slot->second.push_back(t);
}

at::Tensor adaln_cuda(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  check_adaln(x, shift, scale);
  for (auto [t, name] : {std::pair{&x, "x"}, {&shift, "shift"}, {&scale, "scale"}}) {
    expect_cuda_bf16(*t, "dit_adaln", name);
    expect_vector_rows(*t, "dit_adaln", name);
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  AdaLNParams p{bf(x), bf(shift), bf(scale), bf_mut(out), x.stride(0), shift.stride(0), scale.stride(0),
                int(x.size(0)), int(x.size(1)), int(x.size(0) / shift.size(0)), float(eps)};
  adaln_launch(p, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Shared by dit_linear and dit_lm_head: validation of the GEMM operands and the workspace of a plan.
struct LinearWorkspace {
  at::Tensor partials, argmax_val, argmax_idx;
  Counters counters;
};

// Counters only when a fixup uses them (split-K or the argmax), from fixup_counters.
LinearWorkspace linear_workspace(const at::Tensor& x, const LinearPlan& plan, bool argmax) {
  auto f32 = x.options().dtype(at::kFloat), i32 = x.options().dtype(at::kInt);
  const bool fixup = plan.counters > 0 && (plan.splits > 1 || argmax);  // a cluster split-K needs none
  return {at::empty({int64_t(plan.partial_floats)}, f32), at::empty({int64_t(plan.argmax_slots)}, f32),
          at::empty({int64_t(plan.argmax_slots)}, i32), fixup_counters(x, fixup ? plan.counters : 0)};
}

void expect_gemm_operands(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  expect_cuda_bf16(x, op, "x");
  expect_cuda_bf16(weight, op, "weight");
  expect_vector_rows(x, op, "x");
  expect_vector_rows(weight, op, "weight");
  TORCH_CHECK_VALUE(x.size(1) % 64 == 0 && x.size(1) > 0, op, ": on CUDA the input width K must be a "
                    "positive multiple of 64, got ", x.size(1));
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::string_view activation, const std::optional<at::Tensor>& gate,
                       const std::optional<at::Tensor>& residual) {
  check_linear(x, weight, bias, gate, residual);
  const int act = parse_activation(std::string(activation));
  expect_gemm_operands(x, weight, "dit_linear");
  for (auto [t, name] : {std::pair{&bias, "bias"}, {&gate, "gate"}, {&residual, "residual"}}) {
    if (!*t) continue;
    expect_cuda_bf16(**t, "dit_linear", name);
    expect_unit_stride(**t, "dit_linear", name);
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const int M = int(x.size(0)), N = int(weight.size(0)), K = int(x.size(1));
  at::Tensor out = at::empty({M, N}, x.options());
  const LinearPlan plan = linear_plan(M, N, K, /*argmax=*/false, x.get_device());
  LinearWorkspace ws = linear_workspace(x, plan, /*argmax=*/false);
  LinearParams p{};
  p.x = bf(x), p.w = bf(weight), p.bias = bf(bias), p.gate = bf(gate), p.residual = bf(residual);
  p.out = bf_mut(out);
  p.x_stride = x.stride(0), p.w_stride = weight.stride(0);
  p.gate_stride = gate ? gate->stride(0) : 0, p.residual_stride = residual ? residual->stride(0) : 0;
  p.M = M, p.N = N, p.K = K, p.rows_per_gate = gate ? int(M / gate->size(0)) : 1;
  p.act = static_cast<Activation>(act);
  p.partials = ws.partials.data_ptr<float>(), p.counters = ws.counters.ptr;
  linear_launch(p, plan, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  hold_for_capture({ws.partials, ws.counters.fresh});
  return out;
}

std::tuple<at::Tensor, at::Tensor> lm_head_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias, int64_t valid_vocab,
                                                bool return_logits, double softcap) {
  const int64_t valid = check_lm_head(x, weight, bias, valid_vocab);
  expect_gemm_operands(x, weight, "dit_lm_head");
  if (bias) {
    expect_cuda_bf16(*bias, "dit_lm_head", "bias");
    expect_unit_stride(*bias, "dit_lm_head", "bias");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const int M = int(x.size(0)), V = int(weight.size(0)), K = int(x.size(1));
  at::Tensor tokens = at::empty({M}, x.options().dtype(at::kLong));
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor logits = return_logits ? at::empty({M, V}, f32) : at::empty({0}, f32);
  const LinearPlan plan = linear_plan(M, V, K, /*argmax=*/true, x.get_device());
  LinearWorkspace ws = linear_workspace(x, plan, /*argmax=*/true);
  LinearParams p{};
  p.x = bf(x), p.w = bf(weight), p.bias = bf(bias);
  p.x_stride = x.stride(0), p.w_stride = weight.stride(0);
  p.M = M, p.N = V, p.K = K, p.rows_per_gate = 1, p.act = Activation::kNone;
  p.argmax = true, p.valid_n = int(valid), p.softcap = float(softcap);
  p.tokens = tokens.data_ptr<int64_t>(), p.logits = return_logits ? logits.data_ptr<float>() : nullptr;
  p.argmax_val = ws.argmax_val.data_ptr<float>(), p.argmax_idx = ws.argmax_idx.data_ptr<int>();
  p.partials = ws.partials.data_ptr<float>(), p.counters = ws.counters.ptr;
  linear_launch(p, plan, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  hold_for_capture({ws.argmax_val, ws.argmax_idx, ws.counters.fresh});
  return {tokens, logits};
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& positions,
                         double theta, double eps) {
  check_rms_norm(x, weight, positions);
  expect_cuda_bf16(x, "dit_rms_norm", "x");
  expect_cuda_bf16(weight, "dit_rms_norm", "weight");
  expect_unit_stride(x, "dit_rms_norm", "x");
  expect_unit_stride(weight, "dit_rms_norm", "weight");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  const at::Tensor pos = positions ? positions->contiguous() : at::Tensor();
  RmsNormParams p{bf(x), bf(weight), positions ? pos.data_ptr<int64_t>() : nullptr, bf_mut(out),
                  x.stride(0), x.stride(1), int(x.size(0)), int(x.size(1)), int(x.size(2)), float(theta),
                  float(eps)};
  rms_norm_launch(p, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& kv_len, double scale) {
  check_attention(q, k, v, kv_len);
  const int D = int(q.size(3));
  TORCH_CHECK_VALUE(attention_supports_head_dim(D), "dit_attention: on CUDA the head dim D must be 64 or 128, got ", D);
  expect_cuda_bf16(q, "dit_attention", "q");
  expect_vector_rows(q, "dit_attention", "q");
  expect_vector_rows(k, "dit_attention", "k");
  expect_vector_rows(v, "dit_attention", "v");
  const c10::cuda::CUDAGuard guard(q.device());
  const int B = int(q.size(0)), Sq = int(q.size(1)), Hq = int(q.size(2)), Skv = int(k.size(1));
  at::Tensor out = at::empty(q.sizes(), q.options());
  const AttentionPlan plan = attention_plan(B, Sq, Skv, Hq, D, q.get_device());
  auto f32 = q.options().dtype(at::kFloat);
  const at::Tensor partial_o = at::empty({int64_t(plan.partial_o_floats)}, f32);
  const at::Tensor partial_lse = at::empty({int64_t(plan.partial_lse_floats)}, f32);
  const Counters counters = fixup_counters(q, plan.splits > 1 ? plan.counters : 0);  // only for the split merge
  const at::Tensor lens = kv_len ? kv_len->contiguous() : at::Tensor();
  AttentionParams p{};
  p.q = bf(q), p.k = bf(k), p.v = bf(v), p.kv_len = kv_len ? lens.data_ptr<int>() : nullptr, p.out = bf_mut(out);
  p.q_batch = q.stride(0), p.q_row = q.stride(1), p.q_head = q.stride(2);
  p.k_batch = k.stride(0), p.k_row = k.stride(1), p.k_head = k.stride(2);
  p.v_batch = v.stride(0), p.v_row = v.stride(1), p.v_head = v.stride(2);
  p.B = B, p.Sq = Sq, p.Skv = Skv, p.Hq = Hq, p.Hkv = int(k.size(2)), p.D = D;
  p.scale = float(scale > 0 ? scale : 1.0 / std::sqrt(double(D)));
  p.partial_o = partial_o.data_ptr<float>(), p.partial_lse = partial_lse.data_ptr<float>();
  p.counters = counters.ptr;
  attention_launch(p, plan, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  hold_for_capture({partial_o, partial_lse, counters.fresh});
  return out;
}

void kv_append_cuda(const at::Tensor& cache, const at::Tensor& values, const at::Tensor& start,
                    const at::Tensor& count) {
  check_kv_append(cache, values, start, count);
  expect_cuda_bf16(cache, "dit_kv_append", "cache");
  expect_vector_rows(cache, "dit_kv_append", "cache");
  expect_vector_rows(values, "dit_kv_append", "values");
  const c10::cuda::CUDAGuard guard(cache.device());
  const at::Tensor st = start.contiguous(), ct = count.contiguous();
  KvAppendParams p{bf_mut(cache), bf(values), st.data_ptr<int>(), ct.data_ptr<int>(),
                   cache.stride(0), cache.stride(1), cache.stride(2), values.stride(0), values.stride(1),
                   values.stride(2), int(cache.size(0)), int(values.size(1)), int(cache.size(1)),
                   int(cache.size(2)), int(cache.size(3))};
  kv_append_launch(p, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---- Fused norms (FLASHMAP_DIT_FUSED_NORMS): the plain linear's params plus LinearParams::fuse.
LinearParams plain_linear_params(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 int act, const LinearWorkspace& ws) {
  LinearParams p{};
  p.x = bf(x), p.w = bf(weight), p.bias = bf(bias);
  p.x_stride = x.stride(0), p.w_stride = weight.stride(0);
  p.M = int(x.size(0)), p.N = int(weight.size(0)), p.K = int(x.size(1)), p.rows_per_gate = 1;
  p.act = static_cast<Activation>(act);
  p.partials = ws.partials.data_ptr<float>(), p.counters = ws.counters.ptr;
  return p;
}

void expect_fused_operands(std::initializer_list<std::pair<const std::optional<at::Tensor>*, const char*>> ts,
                           const char* op) {
  for (auto [t, name] : ts) {
    if (!*t) continue;
    expect_cuda_bf16(**t, op, name);
    expect_unit_stride(**t, op, name);
  }
}

// The tile holds whole heads: D divides the 128-column tile and N (so no tile cuts a head).
void expect_tile_heads(int64_t D, int64_t N, const char* op) {
  TORCH_CHECK_VALUE(D >= 2 && 128 % D == 0 && N % D == 0, op, ": on CUDA the head dim D must divide 128 and N = ",
                    N, ", got D = ", D);
}

at::Tensor norm_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            c10::string_view activation, const std::optional<at::Tensor>& shift,
                            const std::optional<at::Tensor>& scale, double adaln_eps,
                            const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                            int64_t heads, const std::optional<at::Tensor>& positions, double theta, double eps) {
  constexpr const char* op = "dit_norm_linear";
  check_norm_linear(x, weight, bias, shift, scale, q_norm, k_norm, heads, positions);
  const int act = parse_activation(std::string(activation));
  expect_gemm_operands(x, weight, op);
  expect_fused_operands({{&bias, "bias"}, {&q_norm, "q_norm"}, {&k_norm, "k_norm"}}, op);
  for (auto [t, name] : {std::pair{&shift, "shift"}, {&scale, "scale"}}) {
    if (!*t) continue;
    expect_cuda_bf16(**t, op, name);
    expect_vector_rows(**t, op, name);
  }
  if (q_norm) expect_tile_heads(q_norm->size(0), weight.size(0), op);
  const c10::cuda::CUDAGuard guard(x.device());
  const int M = int(x.size(0)), N = int(weight.size(0)), K = int(x.size(1));
  at::Tensor out = at::empty({M, N}, x.options());
  const LinearPlan plan = linear_plan(M, N, K, /*argmax=*/false, x.get_device());
  LinearWorkspace ws = linear_workspace(x, plan, /*argmax=*/false);
  LinearParams p = plain_linear_params(x, weight, bias, act, ws);
  p.out = bf_mut(out);
  const at::Tensor pos = positions ? positions->contiguous() : at::Tensor();
  LinearFusion& f = p.fuse;
  if (shift) {
    p.adaln_prologue = true;
    f.shift = bf(*shift), f.scale = bf(*scale), f.shift_stride = shift->stride(0), f.scale_stride = scale->stride(0);
    f.rows_per_cond = int(M / std::max<int64_t>(shift->size(0), 1)), f.adaln_eps = float(adaln_eps);
  }
  if (q_norm) {
    p.epilogue = LinearEpilogue::kHeadNorm;
    f.head_dim = int(q_norm->size(0)), f.heads = int(heads), f.theta = float(theta), f.eps = float(eps);
    f.q_norm = bf(*q_norm), f.k_norm = bf(k_norm), f.positions = positions ? pos.data_ptr<int64_t>() : nullptr;
  }
  linear_launch(p, plan, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  hold_for_capture({ws.partials, ws.counters.fresh});
  return out;
}

void linear_kv_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& x,
                           const at::Tensor& weight, const std::optional<at::Tensor>& bias, const at::Tensor& k_norm,
                           const at::Tensor& start, const at::Tensor& count, double theta, double eps) {
  constexpr const char* op = "dit_linear_kv_append";
  check_linear_kv_append(k_cache, v_cache, x, weight, bias, k_norm, start, count);
  const at::Tensor rows = x.flatten(0, 1);  // [B * T, K]
  expect_gemm_operands(rows, weight, op);
  expect_cuda_bf16(k_cache, op, "k_cache");
  expect_unit_stride(k_cache, op, "k_cache");
  TORCH_CHECK_VALUE(v_cache.strides() == k_cache.strides(), op, ": on CUDA v_cache needs the strides of k_cache ",
                    dims_str(k_cache.strides()), ", got ", dims_str(v_cache.strides()));
  const std::optional<at::Tensor> kn = k_norm.contiguous();
  expect_fused_operands({{&bias, "bias"}, {&kn, "k_norm"}}, op);
  expect_tile_heads(k_cache.size(4), weight.size(0), op);
  const c10::cuda::CUDAGuard guard(x.device());
  const int M = int(rows.size(0)), N = int(weight.size(0)), K = int(rows.size(1));
  const LinearPlan plan = linear_plan(M, N, K, /*argmax=*/false, x.get_device());
  LinearWorkspace ws = linear_workspace(rows, plan, /*argmax=*/false);
  LinearParams p = plain_linear_params(rows, weight, bias, 0, ws);
  const at::Tensor st = start.contiguous(), ct = count.contiguous();
  LinearFusion& f = p.fuse;
  p.epilogue = LinearEpilogue::kKvAppend;
  f.head_dim = int(k_cache.size(4)), f.heads = int(k_cache.size(3)), f.theta = float(theta), f.eps = float(eps);
  f.k_cache = bf_mut(k_cache), f.v_cache = bf_mut(v_cache), f.kv_norm = bf(*kn);
  f.start = st.data_ptr<int>(), f.count = ct.data_ptr<int>();
  f.cache_layer = k_cache.stride(0), f.cache_batch = k_cache.stride(1), f.cache_row = k_cache.stride(2);
  f.cache_head = k_cache.stride(3), f.T = int(x.size(1)), f.L = int(k_cache.size(2));
  linear_launch(p, plan, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  hold_for_capture({ws.partials, ws.counters.fresh});
}

}  // namespace

TORCH_LIBRARY_IMPL(flashmap, CUDA, m) {
  m.impl("dit_adaln", &adaln_cuda);
  m.impl("dit_linear", &linear_cuda);
  m.impl("dit_rms_norm", &rms_norm_cuda);
  m.impl("dit_attention", &attention_cuda);
  m.impl("dit_kv_append", &kv_append_cuda);
  m.impl("dit_lm_head", &lm_head_cuda);
  m.impl("dit_norm_linear", &norm_linear_cuda);
  m.impl("dit_linear_kv_append", &linear_kv_append_cuda);
}

}  // namespace flashmap::dit

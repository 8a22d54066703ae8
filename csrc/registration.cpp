// Every op schema of the `flashmap` library, on one screen. Kernels register per backend in their own
// files (TORCH_LIBRARY_IMPL(flashmap, CPU|CUDA, m)); fake (meta) kernels live in flashmap_ext/ops/.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(flashmap, m) {
  // Fused acceptance step of chain speculative decoding (DESIGN.md §3.1). Outputs never depend on data
  // for their shapes: tokens [B, K+1] int64 (-1 after the emitted prefix), num_accepted [B] int32,
  // status [B] int32 (bit flags, 0 = clean row).
  m.def(
      "verify(Tensor target_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor seed, Tensor position, Tensor? draft_probs=None, int valid_vocab=0, Tensor? uniforms=None) "
      "-> (Tensor tokens, Tensor num_accepted, Tensor status)");
  // The same with each sampling parameter a [B] tensor or None and its value (used for every row when None):
  // python scalars reach the kernel by value, without a fill kernel per call.
  m.def(
      "verify.scalars(Tensor target_logits, Tensor draft_tokens, Tensor? temperature, Tensor? top_k, "
      "Tensor? top_p, Tensor? seed, Tensor? position, float temperature_value, int top_k_value, "
      "float top_p_value, int seed_value, int position_value, Tensor? draft_probs=None, int valid_vocab=0, "
      "Tensor? uniforms=None) -> (Tensor tokens, Tensor num_accepted, Tensor status)");

  // FlashMap DiT drafter ops (DESIGN.md §5, §10; csrc/dit/dit_ops.h). bf16 on CUDA, any float dtype on
  // CPU. Letters: M rows (B*K slots), N/K out/in features, G conditioning rows (M % G == 0), H heads,
  // D head dim, V vocabulary. Output shapes never depend on data.
  m.def("dit_adaln(Tensor x, Tensor shift, Tensor scale, float eps=1e-06) -> Tensor");  // [M, N]
  m.def("dit_linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', Tensor? gate=None, "
        "Tensor? residual=None) -> Tensor");  // [M, N] = residual + gate * act(x @ weight^T + bias)
  m.def("dit_rms_norm(Tensor x, Tensor weight, Tensor? positions=None, float theta=10000.0, "
        "float eps=1e-06) -> Tensor");  // [M, H, D], RoPE when positions [M] int64 is given
  m.def("dit_attention(Tensor q, Tensor k, Tensor v, Tensor? kv_len=None, float scale=0.0) -> Tensor");
  m.def("dit_kv_append(Tensor(a!) cache, Tensor values, Tensor start, Tensor count) -> ()");
  m.def("dit_lm_head(Tensor x, Tensor weight, Tensor? bias=None, int valid_vocab=0, bool return_logits=False, "
        "float softcap=0.0) -> (Tensor tokens, Tensor logits)");  // [M] int64, [M, V] fp32 or [0]
  // Fused forms (FLASHMAP_DIT_FUSED_NORMS; dit_ops.h): adaLN prologue and QK-norm/RoPE epilogue of a linear;
  // the memory K/V projection with the key norm, RoPE and the cache append in its epilogue.
  m.def("dit_norm_linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', Tensor? shift=None, "
        "Tensor? scale=None, float adaln_eps=1e-06, Tensor? q_norm=None, Tensor? k_norm=None, int heads=0, "
        "Tensor? positions=None, float theta=10000.0, float eps=1e-06) -> Tensor");  // [M, N]
  m.def("dit_linear_kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor x, Tensor weight, Tensor? bias, "
        "Tensor k_norm, Tensor start, Tensor count, float theta=10000.0, float eps=1e-06) -> ()");
}

// The extension is loaded as a Python module (`import flashmap_ext._C`) only to run the static
// registrations above; it exposes no Python functions of its own (no pybind11: see DESIGN.md §3).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

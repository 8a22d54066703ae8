// Every op schema of the `flashmap` library, on one screen. Kernels register per backend in their own
// files (TORCH_LIBRARY_IMPL(flashmap, CPU|CUDA, m)); fake (meta) kernels live in flashmap_ext/ops.py.
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
}

// The extension is loaded as a Python module (`import flashmap_ext._C`) only to run the static
// registrations above; it exposes no Python functions of its own (no pybind11: see DESIGN.md §3).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

// FlashInfer's chain speculative sampling with its softmax (and top-p renormalisation), for the side-by-side
// verify benchmark (benches/bench_verify_side.py). Compiled at run time with nvcc against the header-only
// sources of the `flashinfer-python` wheel (its include/flashinfer/, unpacked into third_party/flashinfer/,
// never committed) into a shared library that the benchmark calls through ctypes with raw device pointers
// and the current stream: no torch headers, so it also compiles on a machine without a GPU.
//   nvcc -O3 -std=c++17 -arch=sm_90a -shared -Xcompiler -fPIC -I third_party/flashinfer/include \
//        benches/flashinfer_chain.cu -o libfi_chain.so
#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/sampling.cuh"

namespace fs = flashinfer::sampling;

extern "C" {

// probs [rows, d] = softmax(logits / temperature) in fp32 (FlashInfer's python API takes fp32 logits).
// workspace: at least rows * d * 4 bytes of scratch for its split-vocabulary path.
int fi_softmax_f32(float* logits, float* probs, uint32_t rows, uint32_t d, float temperature, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
  return static_cast<int>(fs::OnlineSoftmax<float>(logits, probs, rows, d, nullptr, temperature, workspace,
                                                   workspace_bytes, /*enable_pdl=*/false, stream));
}

// renormed [rows, d] = probs restricted to the top-p nucleus and renormalised.
int fi_top_p_renorm_f32(float* probs, float* renormed, uint32_t rows, uint32_t d, float top_p,
                        cudaStream_t stream) {
  return static_cast<int>(fs::TopPRenormProb<float>(probs, renormed, nullptr, rows, top_p, d, stream));
}

// Chain speculative sampling: draft_probs [B, K, d], draft ids [B, K] int32, target_probs [B, K+1, d] ->
// output ids [B, K+1] int32 (-1 padded), accepted [B], emitted [B].
int fi_chain_f32(float* draft_probs, int32_t* draft_ids, float* target_probs, int32_t* output_ids,
                 int32_t* accepted, int32_t* emitted, uint32_t batch, uint32_t k, uint32_t d, uint64_t seed,
                 uint64_t offset, cudaStream_t stream) {
  return static_cast<int>(fs::ChainSpeculativeSampling<float, int32_t>(
      draft_probs, draft_ids, target_probs, output_ids, accepted, emitted, batch, k, d,
      /*deterministic=*/true, nullptr, seed, nullptr, offset, stream));
}

}  // extern "C"

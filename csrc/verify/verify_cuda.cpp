// verify — CUDA registration: validate (verify_glue.h), build VerifyParams, launch on the current stream
// (verify_kernel.cu, or verify_v2_kernel.cu with FLASHMAP_VERIFY_KERNEL=v2). No host sync, outputs allocated with at::empty only: CUDA-graph safe.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/fixup_counters_glue.h"
#include "verify/verify_glue.h"
#include "verify/verify_launch.h"
#include "flashmap.h"

namespace flashmap {

namespace {
VerifyResult run_cuda(const VerifyTensors& t, const VerifyParams& p) {
  TORCH_CHECK_VALUE(p.valid_vocab <= verify_cuda_max_vocab(), "verify: the CUDA kernel supports V <= ",
                    verify_cuda_max_vocab(), ", got valid_vocab ", p.valid_vocab);
  TORCH_CHECK_VALUE(p.valid_vocab < (int64_t{1} << 32), "verify: valid_vocab must be < 2^32");
  const VerifyKernel kernel = verify_kernel_choice();
  verify_check_kernel_limits(kernel, p);
  if (kernel == VerifyKernel::kV2) {  // one launch; arrival counters per batch row (fixup_counters_glue.h)
    const Counters counters = fixup_counters(t.logits, static_cast<size_t>(p.B));
    C10_CUDA_CHECK(verify_v2_cuda_launch(p, counters.ptr, c10::cuda::getCurrentCUDAStream()));
  } else {
    verify_cuda_launch(p, c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {t.tokens, t.num_accepted, t.status};
}
}  // namespace

VerifyResult verify_cuda(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                         const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                         const at::Tensor& seed, const at::Tensor& position,
                         const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                         const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.is_cuda(), "verify: target_logits must be a CUDA tensor here");
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const VerifyTensors t = verify_prepare(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                         position, draft_probs, uniforms);
  return run_cuda(t, verify_params(t, valid_vocab));
}

VerifyResult verify_scalars_cuda(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                 const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
                                 const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seed,
                                 const std::optional<at::Tensor>& position, double temperature_value,
                                 int64_t top_k_value, double top_p_value, int64_t seed_value, int64_t position_value,
                                 const std::optional<at::Tensor>& draft_probs, int64_t valid_vocab,
                                 const std::optional<at::Tensor>& uniforms) {
  TORCH_CHECK_VALUE(target_logits.is_cuda(), "verify: target_logits must be a CUDA tensor here");
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const VerifyTensors t = verify_prepare(target_logits, draft_tokens, temperature, top_k, top_p, seed,
                                         position, draft_probs, uniforms);
  const VerifyScalars v{temperature_value, top_p_value, top_k_value, seed_value, position_value};
  return run_cuda(t, verify_params(t, valid_vocab, v));
}

TORCH_LIBRARY_IMPL(flashmap, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("verify.scalars", &verify_scalars_cuda);
}

}  // namespace flashmap

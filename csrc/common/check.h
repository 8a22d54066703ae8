// Argument checks for the torch glue (never included by device code). Every message names the
// argument and what was expected, e.g. "verify: draft_tokens must be [B, K] = [3, 4], got [3, 5]".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace flashmap {

inline std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Value errors (Python ValueError).
inline void check_shape(const at::Tensor& t, const char* op, const char* name, const char* letters,
                        std::vector<int64_t> expected) {
  TORCH_CHECK_VALUE(t.sizes().vec() == expected, op, ": ", name, " must be ", letters, " = ",
                    shape_str(expected), ", got ", shape_str(t.sizes()));
}

// Type errors (Python TypeError).
inline void check_dtype(const at::Tensor& t, const char* op, const char* name, at::ScalarType expected) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, op, ": ", name, " must be ", c10::toString(expected),
                   ", got ", c10::toString(t.scalar_type()));
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device().str(),
                    " but target_logits is on ", ref.device().str());
}

}  // namespace flashmap

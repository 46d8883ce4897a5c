// Argument validation shared by every op's public (non-virtual) methods.
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

// Throws rn::Error naming `op`, the argument `what` and the mismatch if `t` does not
// have the expected shape and dtype (and, for 4-D tensors, layout), or has no data.
void check_tensor(const Tensor& t, const Shape& shape, DType dtype, Layout layout, const char* what,
                  const std::string& op);
inline void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* what, const std::string& op) {
  check_tensor(t, shape, dtype, Layout::nchw, what, op);
}

}  // namespace rn

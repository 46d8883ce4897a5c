// Private to the reference backend: the per-family kernel factories that RefBackend
// forwards to, and the small helpers the kernels share (dtype refusal, 4-D strides).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/check.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace rn::ref {

// Every factory validates the descriptor, then refuses (rn::Unsupported) anything but fp32.
std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d);
std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d);
std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d);
std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d);
std::unique_ptr<CastKernel> make_cast(const CastDesc& d);  // every float conversion
std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d);
std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d);
std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d);
std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d);

// Throws rn::Unsupported unless `dtype` is fp32; `op` is the descriptor's str().
inline void require_f32(DType dtype, const std::string& op) {
  if (dtype != DType::f32) {
    RN_UNSUPPORTED() << "ref backend: " << op << ": ref only computes fp32 (got " << dtype_name(dtype)
                     << "); round the values to the half type and run them in fp32";
  }
}

// Element strides of a logical NCHW 4-D shape laid out as `layout`, so that inner loops
// index with multiply-adds instead of calling Tensor::offset per element.
struct Strides4 {
  int64_t n, c, h, w;
};
inline Strides4 strides4(int64_t C, int64_t H, int64_t W, Layout layout) {
  if (layout == Layout::nchw) return {C * H * W, H * W, W, 1};
  return {H * W * C, 1, W * C, C};
}

}  // namespace rn::ref

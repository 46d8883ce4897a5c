// conv2d: y[N,K,P,Q] = sum_{c,r,s} x[N, g*C/G + c, p*sh - ph + r*dh, q*sw - pw + s*dw] * w[K, c, r, s] + b[K]
//
// Gradient rule (all ops): activation gradients are overwritten (=), parameter gradients
// accumulate (+=). Parameter gradients (dw, db) are always fp32; w has the activation
// dtype (the half copy of the fp32 master under mixed precision); b is always fp32.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace rn {

struct Conv2dParams {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  bool bias = false;
};

// cuDNN's convolutions address at most this many elements per tensor (the legacy API's int
// dimensions and strides): the cuda backend refuses a larger x or y, naming the largest batch
// that fits (PyTorch splits such a batch), and `resnet bench --find-max-batch` stays below it.
constexpr int64_t kCudnnMaxTensorElements = 2147483647;

struct Conv2dDesc {
  Conv2dParams p;
  int64_t batch = 1, in_h = 1, in_w = 1;
  DType dtype = DType::f32;  // x, y, w, dx, dy
  Layout layout = Layout::nchw;
  // y and/or dx in fp32 instead (dtype half; x, w and dy stay half): the casts from the half
  // convolution to the fp32 activations around it (precision O1) fused into the convolution,
  // which rounds its fp32 accumulators to fp32 instead of to the half type. Only where the
  // backend says so (Backend::conv_f32_outputs()). The two are separate because the plan
  // sets each by what is on that side: f32_y where fp32 layers read y, f32_dx where x is
  // an fp32 value (not where a batch norm writes x in the half type itself).
  bool f32_y = false, f32_dx = false;

  DType y_dtype() const { return f32_y ? DType::f32 : dtype; }
  DType dx_dtype() const { return f32_dx ? DType::f32 : dtype; }

  int64_t out_h() const { return (in_h + 2 * p.pad_h - p.dilation_h * (p.kernel_h - 1) - 1) / p.stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * p.pad_w - p.dilation_w * (p.kernel_w - 1) - 1) / p.stride_w + 1; }
  Shape x_shape() const { return {batch, p.in_channels, in_h, in_w}; }
  Shape y_shape() const { return {batch, p.out_channels, out_h(), out_w()}; }
  Shape w_shape() const { return {p.out_channels, p.in_channels / p.groups, p.kernel_h, p.kernel_w}; }
  int64_t macs() const;  // forward multiply-accumulates
  void validate() const;  // throws rn::Error naming the bad field
  std::string str() const;
};

class Conv2dKernel {
 public:
  explicit Conv2dKernel(const Conv2dDesc& d) : desc_(d) {}
  virtual ~Conv2dKernel() = default;
  const Conv2dDesc& desc() const { return desc_; }
  // The library's name for the forward algorithm in use, where the backend tells ("" else).
  virtual std::string implementation() const { return {}; }
  // The dtype its multiply-adds run in: desc().dtype, unless the backend widens half tensors
  // for fp32 kernels (the cpu backend's bf16 convolutions where run.cpu_bf16_conv_arithmetic
  // chooses fp32). The per-layer profile holds such a layer against the fp32 peak; the doctor
  // shows it.
  virtual DType arithmetic() const { return desc_.dtype; }

  // y = conv(x, w) + b          (b may be null; required iff desc.p.bias)
  void forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b);
  // dx = conv_transpose(dy, w)
  void backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w);
  // dw += corr(x, dy); db += sum dy
  void backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) = 0;
  virtual void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) = 0;
  virtual void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) = 0;
  Conv2dDesc desc_;
};

}  // namespace rn

// Pooling.
//   max_pool2d: y[n,c,p,q] = max over the window (padding never wins; windows are
//     clipped to the input). Forward writes a backend-defined workspace (ref: int32 argmax
//     per output) of workspace_bytes(); backward reads it: dx = scatter(dy) (overwritten).
//   global_avg_pool: y[N,C] (2-D, dense) = mean over H, W of x[N,C,H,W];
//     backward: dx = dy / (H*W) broadcast (overwritten).
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

struct MaxPoolDesc {
  int64_t batch = 1, channels = 1, in_h = 1, in_w = 1;
  int64_t kernel = 3, stride = 2, pad = 1;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;

  int64_t out_h() const { return (in_h + 2 * pad - kernel) / stride + 1; }
  int64_t out_w() const { return (in_w + 2 * pad - kernel) / stride + 1; }
  Shape x_shape() const { return {batch, channels, in_h, in_w}; }
  Shape y_shape() const { return {batch, channels, out_h(), out_w()}; }
  void validate() const;
  std::string str() const;
};

class MaxPoolKernel {
 public:
  explicit MaxPoolKernel(const MaxPoolDesc& d) : desc_(d) {}
  virtual ~MaxPoolKernel() = default;
  const MaxPoolDesc& desc() const { return desc_; }
  virtual size_t workspace_bytes() const = 0;
  // workspace: a u8 tensor of at least workspace_bytes()
  void forward(const Tensor& y, const Tensor& workspace, const Tensor& x);
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& workspace, const Tensor& x) = 0;
  virtual void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace) = 0;
  MaxPoolDesc desc_;
};

struct GlobalAvgPoolDesc {
  int64_t batch = 1, channels = 1, h = 1, w = 1;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  Shape x_shape() const { return {batch, channels, h, w}; }
  Shape y_shape() const { return {batch, channels}; }
  void validate() const;
  std::string str() const;
};

class GlobalAvgPoolKernel {
 public:
  explicit GlobalAvgPoolKernel(const GlobalAvgPoolDesc& d) : desc_(d) {}
  virtual ~GlobalAvgPoolKernel() = default;
  const GlobalAvgPoolDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& x);
  void backward(const Tensor& dx, const Tensor& dy);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x) = 0;
  virtual void do_backward(const Tensor& dx, const Tensor& dy) = 0;
  GlobalAvgPoolDesc desc_;
};

}  // namespace rn

// batch_norm over N, H, W per channel C, optionally fused with ReLU or with a residual
// add and ReLU:
//   none:     y = gamma * (x - mean) * invstd + beta
//   relu:     y = max(0, bn(x))
//   add_relu: y = max(0, bn(x) + residual)
// Training uses batch statistics, returns them (saved_mean, saved_invstd = 1/sqrt(var+eps),
// biased var) for backward, and updates the running stats like PyTorch:
//   running_mean = (1-momentum)*running_mean + momentum*mean
//   running_var  = (1-momentum)*running_var  + momentum*var*n/(n-1)
// x, y, residual, dx, dy, dresidual have the activation dtype; gamma, beta, saved and
// running stats and their gradients are fp32. dx, dresidual are overwritten; dgamma,
// dbeta accumulate. Backward reads y for the ReLU mask (y > 0) when fused; dx may be dy
// itself (in place).
// forward_recompute regenerates the y of an earlier forward_training bit for bit (memory
// level O2 frees y after forward and rebuilds it just before backward needs it).
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

enum class BnFuse : uint8_t { none, relu, add_relu };
std::string_view bn_fuse_name(BnFuse f);

struct BatchNormDesc {
  int64_t batch = 1, channels = 1, h = 1, w = 1;
  float eps = 1e-5f;
  float momentum = 0.1f;
  BnFuse fuse = BnFuse::none;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;

  Shape x_shape() const { return {batch, channels, h, w}; }
  void validate() const;
  std::string str() const;
};

class BatchNormKernel {
 public:
  explicit BatchNormKernel(const BatchNormDesc& d) : desc_(d) {}
  virtual ~BatchNormKernel() = default;
  const BatchNormDesc& desc() const { return desc_; }

  // residual must be non-null iff fuse == add_relu.
  void forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                        const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var);
  void forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& running_mean, const Tensor& running_var);
  // Rewrites exactly the y that forward_training wrote from the same x, residual, gamma and
  // beta, given the saved statistics it returned. Running statistics are not touched. The
  // batch statistics are computed again and must equal saved_mean/saved_invstd bit for bit;
  // otherwise (changed inputs, a nondeterministic kernel) it throws rn::Error.
  void forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd);
  // dresidual must be non-null iff fuse == add_relu (it receives dy * relu_mask).
  void backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                const Tensor& saved_invstd);

 protected:
  virtual void do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd,
                                   const Tensor& x, const Tensor* residual, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var) = 0;
  virtual void do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) = 0;
  virtual void do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) = 0;
  virtual void do_backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                           const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                           const Tensor& saved_mean, const Tensor& saved_invstd) = 0;
  BatchNormDesc desc_;
};

}  // namespace rn

// batch_norm over N, H, W per channel C, optionally fused with ReLU or with a residual
// add and ReLU:
//   none:     y = gamma * (x - mean) * invstd + beta
//   relu:     y = max(0, bn(x))
//   add_relu: y = max(0, bn(x) + residual)
// Training uses batch statistics, returns them (saved_mean, saved_invstd = 1/sqrt(var+eps),
// biased var) for backward, and updates the running stats like PyTorch:
//   running_mean = (1-momentum)*running_mean + momentum*mean
//   running_var  = (1-momentum)*running_var  + momentum*var*n/(n-1)
// x, y, residual, dx, dy, dresidual have the activation dtype (but see half_y, half_dx);
// gamma, beta, saved and running stats and their gradients are fp32. dx, dresidual are
// overwritten; dgamma, dbeta accumulate. Backward reads y for the ReLU mask (y > 0) when fused; dx may be dy
// itself (in place); dresidual shares memory with none of dx, dy, x and y.
// forward_recompute regenerates the y of an earlier forward_training bit for bit (memory
// level O2 frees y after forward and rebuilds it just before backward needs it).
//
// Synchronised BN (data-parallel training, set_stats_reducer): with W ranks each holding
// M_k values per channel, training uses the statistics of all M = sum M_k values:
//   forward:  one reducer->sum() of [sum x (C), sum x^2 (C), M_k] (2C+1 doubles);
//             mean = S / M, var = Q / M - mean^2 (biased); saved and running statistics get
//             these global values (running_var with M / (M - 1));
//   backward: one reducer->sum() of [sum g (C), sum g xhat (C), M_k]; dx uses the global
//             sums and M; dgamma and dbeta still accumulate only this rank's sums (the
//             gradient all-reduce combines them), dresidual = g as before.
// With W ranks of batch B and gradients averaged over ranks, that equals one kernel on
// batch W*B (each rank's loss being the mean over its own batch). forward_recompute never
// communicates: it renormalises with the saved (global) statistics. Inference is unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace rn {

// Sums per-channel batch statistics over the ranks of a data-parallel job (synchronised
// BN). Every rank calls sum() the same number of times in the same order.
class BatchStatsReducer {
 public:
  virtual ~BatchStatsReducer() = default;
  virtual void sum(double* values, int64_t n) = 0;  // in place, element-wise over all ranks
  // true: `values` is memory of the device that trains (NCCL), summed in order on its
  // stream (work queued after sum() sees the result; the host does not wait). The CUDA
  // batch norm needs such a reducer; host kernels pass their own memory to either kind.
  virtual bool on_device() const { return false; }
};

enum class BnFuse : uint8_t { none, relu, add_relu };
std::string_view bn_fuse_name(BnFuse f);

struct BatchNormDesc {
  int64_t batch = 1, channels = 1, h = 1, w = 1;
  float eps = 1e-5f;
  float momentum = 0.1f;
  BnFuse fuse = BnFuse::none;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  // Precision O1 with its casts fused (where Backend::bn_half_io() says yes): y (and so dy)
  // and/or dx in `half` while x, residual and dresidual keep dtype, which is then fp32; the
  // arithmetic is fp32 as always, and only the stores round. The plan sets half_y where a
  // half convolution alone reads y, half_dx where x is a convolution's fp32 output, whose
  // gradient that convolution reads in half. With the ReLU alone (fuse relu), y and dx share
  // a dtype: backward keeps dy * (y > 0) in dx.
  DType half = DType::bf16;
  bool half_y = false, half_dx = false;

  DType y_dtype() const { return half_y ? half : dtype; }  // y and dy
  DType dx_dtype() const { return half_dx ? half : dtype; }
  bool mixed() const { return half_y || half_dx; }
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
  // otherwise (changed inputs, a nondeterministic kernel) it throws rn::Error. With a stats
  // reducer it does not communicate: it normalises with saved_mean/saved_invstd, which must
  // be those of the last forward_training, as must this rank's local sums of x (else
  // rn::Error).
  void forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd);
  // dresidual must be non-null iff fuse == add_relu (it receives dy * relu_mask).
  void backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                const Tensor& saved_invstd);

  // Synchronised statistics in training (see the top of this file); nullptr (the default)
  // means per-rank statistics. The reducer is not owned and must outlive its use. A backend
  // that cannot synchronise throws rn::Unsupported saying why (and keeps the old setting).
  void set_stats_reducer(BatchStatsReducer* r);
  BatchStatsReducer* stats_reducer() const { return reducer_; }

 protected:
  // Prepares the backend for `r` (nullptr: back to per-rank statistics). The default
  // refuses any reducer, so a backend opts in by overriding it.
  virtual void do_set_stats_reducer(BatchStatsReducer* r);
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

 private:
  BatchStatsReducer* reducer_ = nullptr;
};

}  // namespace rn

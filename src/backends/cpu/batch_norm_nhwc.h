// Batch norm over NHWC activations (fp32 or bf16) in our own vectorised loops, for the
// per-rank case; the synchronised batch norm (batch_norm_sync.h) runs the same passes with
// fp64 sums (see the public passes below). oneDNN 2.6's NHWC batch norm has no fused add+ReLU
// and no ReLU in its backward that reads y, so it cost two extra passes over the tensor
// (an add+ReLU after the forward, a ReLU mask before the backward); these loops fold both
// in, and read each tensor fewer times:
//   forward training: one pass for the statistics (reads x), one to normalise (reads x
//     [and residual], writes y);
//   backward: one pass that forms g = dy * (y > 0) when fused, writes it into dresidual
//     (add_relu) or dx (relu), and sums g and g * (x - mean); one that writes dx from g and x.
// Statistics: per-channel sums of d = x - K and d^2, where K is the first pixel's value of
// the channel (a shift that keeps the one-pass variance from cancelling when the mean is
// large next to the spread), accumulated in fp32 over chunks of 128 pixels (in vector
// registers, 64 channels at a time) and in fp64 across chunks and threads.
// mean = K + S/M, var = max(Q/M - (S/M)^2, 0).
// Pixels are split evenly over the OpenMP threads and the per-thread sums added in thread
// order, so for a fixed thread count the statistics are the same bits every time, which
// forward_recompute relies on.
// The loops are compiled for x86-64-v4 (AVX-512), v3 (AVX2, FMA) and baseline x86-64, and the
// best the CPU runs is chosen at load time (GCC's target_clones); isa() names it.
#pragma once

#include <string>
#include <vector>

#include "ops/batch_norm.h"

namespace rn::cpu {

class NhwcBatchNorm {
 public:
  explicit NhwcBatchNorm(const BatchNormDesc& d);

  // Arguments and contract as BatchNormKernel's (already validated).
  void forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                        const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var);
  void forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& running_mean, const Tensor& running_var);
  void forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd);
  void backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy,
                const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                const Tensor& saved_invstd);

  // The passes on their own, for the synchronised batch norm (SyncBatchNorm), which reduces
  // the per-channel sums over the ranks between them. Each covers this rank's N*H*W pixels.
  // Its sums are fp64 per element (no shift, no fp32 chunks): the same to fp64 rounding
  // however the batch is split over ranks and threads, so that W ranks of batch B give the
  // statistics of one batch of W*B to the last bit nearly always; and the same bits on every
  // call with the same inputs and thread count.
  //
  // sums[c] = sum of x, sums[C + c] = sum of x^2 over channel c.
  void sums_of_x(const Tensor& x, double* sums);
  // y = [relu]((x - mean) * scale + beta [+ residual]) with scale = gamma * invstd, all fp32.
  void normalize(const Tensor& y, const Tensor& x, const Tensor* residual, const float* mean, const float* invstd,
                 const float* gamma, const float* beta);
  // The backward's first pass: g = dy * (y > 0) when fused, written to dresidual (add_relu)
  // or dx (relu), and sums[c] = sum of g, sums[C + c] = sum of g * (x - mean) over channel c.
  // Returns the tensor that holds g (dy when not fused).
  const Tensor& gradient_sums(const Tensor& dx, const Tensor* dresidual, const Tensor& dy, const Tensor& x,
                              const Tensor& y, const float* mean, double* sums);
  // The second: dx = a g + (b (x - mean) + e) per channel (dx may be g).
  void gradient_input(const Tensor& dx, const Tensor& g, const Tensor& x, const float* mean, const float* a,
                      const float* b, const float* e);

  // The instruction set the loops run with on this CPU: "x86-64-v4", "x86-64-v3" or "x86-64".
  static std::string isa();

 private:
  // Batch mean and biased variance of x per channel (mean_, var_).
  void statistics(const Tensor& x);
  // The backward's first pass with fp64 sums (fp64 true: gradient_sums) or the per-rank fp32
  // chunks (backward); the sums are left in part_[0, 2C).
  const Tensor& first_backward_pass(const Tensor& dx, const Tensor* dresidual, const Tensor& dy, const Tensor& x,
                                    const Tensor& y, const float* mean, bool fp64);

  BatchNormDesc d_;
  int64_t m_;                 // N * H * W
  std::vector<double> part_;  // [threads][2C]: per-thread sums
  std::vector<float> shift_;  // [C]: K
  std::vector<double> mean_, var_;
  std::vector<float> scale_, a_, b_, e_;  // [C] each
};

}  // namespace rn::cpu

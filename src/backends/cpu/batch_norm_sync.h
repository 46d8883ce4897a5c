// Synchronised batch norm on the CPU (private to the CPU backend): fp32 or bf16 activations
// in NCHW (OpenMP loops) or NHWC (the passes of the per-rank NHWC loops, NhwcBatchNorm), with
// the fused ReLU and add+ReLU. oneDNN's batch normalisation computes its statistics inside
// the primitive and cannot reduce them over ranks, so CpuBatchNorm uses this instead
// whenever a BatchStatsReducer is set. The arithmetic is fp32 per element with fp64
// per-channel sums; see ops/batch_norm.h for the semantics and batch_norm_sync.cpp for the
// details.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/batch_norm.h"

namespace rn::cpu {

class NhwcBatchNorm;

class SyncBatchNorm {
 public:
  explicit SyncBatchNorm(const BatchNormDesc& d);
  ~SyncBatchNorm();

  // Arguments as BatchNormKernel's (already validated); the reducer is called once.
  void forward_training(BatchStatsReducer& reducer, const Tensor& y, const Tensor& saved_mean,
                        const Tensor& saved_invstd, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                        const Tensor& beta, const Tensor& running_mean, const Tensor& running_var);
  // Never communicates: normalises with the saved statistics, after checking that x and the
  // saved statistics are those of the last forward_training.
  void forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                         const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd);
  // The reducer is called once; dgamma and dbeta accumulate this rank's sums only.
  void backward(BatchStatsReducer& reducer, const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma,
                const Tensor& dbeta, const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                const Tensor& saved_mean, const Tensor& saved_invstd);

 private:
  // Per-channel fp32 coefficients of the normalisation from the saved statistics, the same
  // in forward_training and forward_recompute so that both write the same bits.
  void set_affine(const Tensor& gamma, const Tensor& saved_mean, const Tensor& saved_invstd);
  void local_sums_of_x(const Tensor& x);  // sync_[0, 2C) = sum x, sum x^2
  void normalize(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma, const Tensor& beta);

  BatchNormDesc d_;
  int64_t m_;                                 // N * H * W on this rank
  std::vector<double> sync_;                  // [2C + 1]: what the reducer sums
  std::unique_ptr<NhwcBatchNorm> nhwc_;       // NHWC: its passes; null in NCHW
  std::vector<double> forward_sums_;          // [2C]: the last forward's local sums
  std::vector<float> forward_saved_;          // [2C]: and its saved mean, invstd
  std::vector<float> mean_, invstd_, scale_;  // [C] each; scale = gamma * invstd
  std::vector<float> mean_g_, mean_g_xhat_;   // [C] each: backward's global means (NCHW)
  std::vector<float> a_, b_, e_;              // [C] each: NHWC backward's dx coefficients
};

}  // namespace rn::cpu

// One training step over a prepared plan: forward, backward with the loss scale, the
// overflow check on all gradients, then the optimizer (one fused pass that also unscales)
// or a skip that leaves weights and optimizer state untouched. Shared by `resnet train`
// and `resnet bench` so that the benchmark times exactly what training runs.
#pragma once

#include "dist/grad_buckets.h"
#include "model/plan.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace rn {

class TrainStep {
 public:
  TrainStep(Plan& plan, Optimizer& optimizer, LossScaler& scaler, const PrecisionPolicy& policy);

  // The caller has filled plan.input() and plan.labels(). Returns true when the update was
  // applied, false when the step was skipped for an inf/NaN gradient.
  bool run(double lr);

  Plan& plan() { return plan_; }

  // Data-parallel training: backward hands each finished gradient to `reducer`, whose bucket
  // all-reduces (average) overlap the rest of backward; the overflow check and the optimizer
  // then see the averaged gradients, the same on every rank. nullptr: one rank.
  void set_gradient_reducer(GradientReducer* reducer);
  // The last step's communication (zero without a reducer).
  const CommStats& last_comm() const { return comm_; }

 private:
  Plan& plan_;
  Optimizer& optimizer_;
  LossScaler& scaler_;
  PrecisionPolicy policy_;
  GradientReducer* reducer_ = nullptr;
  CommStats comm_;
};

// Rounds every master weight to the nearest `half` value (precision O3).
void round_weights_to(float* weights, int64_t n, DType half);

}  // namespace rn

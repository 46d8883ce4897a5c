// One training step over a prepared plan: forward, backward with the loss scale, the
// overflow check on all gradients, then the optimizer (one fused pass that also unscales)
// or a skip that leaves weights and optimizer state untouched. Shared by `resnet train`
// and `resnet bench` so that the benchmark times exactly what training runs.
#pragma once

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

 private:
  Plan& plan_;
  Optimizer& optimizer_;
  LossScaler& scaler_;
  PrecisionPolicy policy_;
};

// Rounds every master weight to the nearest `half` value (precision O3).
void round_weights_to(float* weights, int64_t n, DType half);

}  // namespace rn

// Precision levels, as the plan sees them:
//   O0  fp32 everywhere.
//   O1  convolutions and linear layers in half precision (inputs cast in, outputs cast
//       back), BN, ReLU, pooling and the loss in fp32; fp32 master weights.
//   O2  half-precision model: activations and conv/linear weights in half; BN parameters
//       and statistics, the loss and the master weights in fp32; loss scaling.
//   O3  pure half precision: as O2, and the weights themselves are kept in half (the
//       master copy is rounded to half after every update, so no fp32 precision survives).
// Half is bf16 or fp16 (precision.half_dtype). Loss scaling follows precision.loss_scale at
// O1-O3 and is off at O0.
#pragma once

#include <string>

#include "model/plan.h"
#include "ops/backend.h"
#include "train/config.h"

namespace rn {

struct PrecisionPolicy {
  PrecisionLevel level = PrecisionLevel::O0;
  DType half = DType::bf16;
  DType conv_dtype = DType::f32;        // PlanOptions::dtype
  DType activation_dtype = DType::f32;  // PlanOptions::activation_dtype
  bool round_master_to_half = false;    // O3
  LossScaleConfig loss_scale;           // policy none at O0

  // One line for the log: "precision O2: bf16 model, fp32 BN/loss/master weights; loss scale dynamic (initial 128...)"
  std::string describe() const;
};

// What the configuration asks for, not checked against any backend (a dry memory plan, or
// the doctor's dtype column where the backend refuses the level); the loss scale is left as
// configured.
PrecisionPolicy intended_precision_policy(const PrecisionConfig& cfg);

// Checks the choice against the backend (fp16 on the CPU is refused with what to use
// instead) and returns the policy.
PrecisionPolicy make_precision_policy(const PrecisionConfig& cfg, const Backend& backend);

}  // namespace rn

// The precision doctor (`resnet doctor`): from the same initial weights and the same
// batches, K training steps in fp32 (O0) and K at the configured precision level, and per
// parameter tensor:
//   - the relative difference of the gradients, ||g_mixed / scale - g_fp32|| / ||g_fp32||,
//     at the first step (the precision error alone) and the largest over the K steps
//     (which also holds the drift of the two trajectories);
//   - the fractions of gradient values that would underflow to zero and overflow to
//     infinity in the half dtype at the loss scale, computed from the fp32 gradients
//     (scale * g against the dtype's limits: prof/tensor_stats.h);
//   - the power-of-two loss scales that avoid both, and from their intersection over all
//     tensors a recommended initial scale;
//   - the dtype it computes in (the active level made visible), with BN, loss and master
//     weights; and the overflow-skip count of the mixed run;
//   - the rounding baseline: the fp32 gradient of a third model whose weights and input are
//     rounded to the half dtype, against the fp32 gradient. It measures how far the network
//     itself moves its gradient under the smallest perturbation the half dtype makes (deep
//     networks at initialisation move it far: tens of percent for a CIFAR resnet56), so that
//     a disagreement fails only when the mixed run differs by more than its thresholds and
//     also by more than diagnostics.doctor_max_diff_ratio times this baseline.
// When the configured dtype cannot run on this backend (fp16 on the CPU), only the fp32
// run is made, and the underflow/overflow figures are the analytic ones: "simulated".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "prof/tensor_stats.h"
#include "train/config.h"

namespace rn {

struct DoctorOptions {
  int steps = 3;
};

struct DoctorTensor {
  std::string name;
  std::string kind;     // conv_weight, bn_gamma, ...
  // The dtype it computes in: "bf16", "fp32 BN, bf16 out", or "bf16, fp32 arith" for a
  // convolution the backend computes in fp32 on bf16 tensors (Conv2dKernel::arithmetic()).
  std::string compute;
  int64_t numel = 0;
  double grad_norm = 0;        // fp32 gradient, first step
  double rel_diff_first = -1;  // -1: not measured (no mixed run)
  double rel_diff_max = -1;
  double rel_diff_rounding = -1;       // the rounding baseline, first step; -1: not measured
  double underflow = 0, overflow = 0;  // largest fractions over the steps, at the scale of each step
  ScaleRange safe;                     // over all steps
};

struct DoctorReport {
  std::string model, level, half;
  std::string backend;  // Backend::describe(): the device and its implementation mode
  bool mixed_ran = false;
  std::string not_run_why;  // when !mixed_ran
  std::string precision;    // PrecisionPolicy::describe() (or what it would be)
  std::string bn_dtype, loss_dtype, master_dtype, activation_dtype;
  // Of the mixed run's convolutions: how many, and how many compute in fp32 arithmetic on
  // half tensors (run.cpu_bf16_conv_arithmetic); 0 and 0 when it did not run.
  int convs = 0, fp32_arithmetic_convs = 0;
  int fp32_output_convs = 0;       // convolutions writing fp32 y (and dx where x is fp32): O1's fused casts
  int bns = 0, half_copy_bns = 0;  // batch norms; those writing a half y or dx (O1's fused casts)
  double loss_scale = 1;  // the scale the doctor checked (configured initial)
  std::string loss_scale_policy = "dynamic";  // precision.loss_scale.policy ("none": the advice names a policy)
  int steps = 0;
  int64_t overflow_skips = 0;
  double final_scale = 1;
  std::vector<double> loss_fp32, loss_mixed;
  std::vector<DoctorTensor> tensors;  // forward order (stem first)
  double rel_diff_total = -1;  // the whole gradient, first step; -1: not measured
  double rounding_diff_total = -1;  // the rounding baseline over the whole gradient; -1: not measured
  ScaleRange safe;
  double recommended_scale = 0;
  bool pass = true;
  std::vector<std::string> problems;
  std::string verdict;  // one line

  std::string table() const;  // the per-tensor table, header lines and the verdict
  nlohmann::json to_json() const;
};

DoctorReport run_doctor(const Config& cfg, const DoctorOptions& options);
// Sets pass, problems and verdict of a report from its figures and the thresholds (the last
// step of run_doctor; on its own for tests).
void decide_doctor_verdict(DoctorReport& r, const DiagnosticsConfig& d);

// "2^7 (128)" style for scales.
std::string format_scale(double s);

}  // namespace rn

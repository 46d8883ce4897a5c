// The per-layer profile behind `resnet profile`: one training step of a zoo model on a
// synthetic batch, timed per plan step (each followed by a device synchronisation), grouped
// per layer (forward; backward = data + weight gradients + recomputation), with the work
// each layer must do (multiply-accumulates, approximate elementwise flops) and the bytes
// it must move (its arena inputs and outputs, weights, weight gradients), the achieved rate
// and bandwidth, its share of the step, and the roof that bounds it against the device's
// peaks, measured at start with a large GEMM and a large streaming elementwise op through
// the same backend (and in fp32 too for the layers of a half-precision profile that compute
// in fp32 arithmetic: LayerProfile::arithmetic).
//
// Consistency: the layers plus the optimizer, overflow check and gradient zeroing add up to
// the profiled step; the report compares that sum with the mean step measured without
// profiling (per-step synchronisation and clock reads cost a little, measured and taken off) and says whether it is
// within kProfileMargin.
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "prof/roofline.h"
#include "train/config.h"

namespace rn {

inline constexpr double kProfileMargin = 0.10;  // |sum - measured| / measured stated as consistent
inline constexpr double kProfileContention = 0.10;  // run-delay share above which the profile is flagged

struct ProfileOptions {
  std::string model = "resnet50";
  int64_t channels = 3, height = 224, width = 224, classes = 1000;
  int64_t batch = 32;
  DType dtype = DType::f32;                 // f32 (O0) or a half dtype (O2 unless `precision` says otherwise)
  std::optional<PrecisionLevel> precision;  // nullopt: O0 for fp32, O2 for a half dtype
  DeviceChoice device = DeviceChoice::auto_select;
  bool high_precision = false;  // run.implementation_mode=high_precision
  Bf16ConvArithmetic bf16_conv_arithmetic = Bf16ConvArithmetic::automatic;  // run.cpu_bf16_conv_arithmetic
  MemoryLevel memory = MemoryLevel::O1;
  int steps = 5, warmup = 2;
  int threads = 0;
};

struct LayerProfile {
  std::string name;             // graph node ("layer1.0.conv1"), "loss", or a group ("casts", "gradient sums")
  std::string kind;             // conv, bn, relu, pool, linear, loss, cast, ...
  double fwd_s = 0, bwd_s = 0;  // seconds per step (the sum of its plan steps' means)
  double macs = 0;              // per step, forward and backward
  double flops = 0;             // 2 x macs + elementwise estimate
  double bytes = 0;             // per step
  // Conv and linear layers: the dtype their multiply-adds run in (Plan::arithmetic(): fp32
  // for the bf16 convolutions the cpu backend computes in fp32), whose GEMM peak is their
  // roof; nullopt for the other layers (held against the profiled dtype's peaks).
  std::optional<DType> arithmetic;
  std::string implementation;  // conv layers: the forward algorithm (Plan::implementation())
  RooflinePoint roof;
  double seconds() const { return fwd_s + bwd_s; }
};

struct ProfileReport {
  std::string model, device, dtype;
  std::string precision;  // "O0" ... "O3"
  std::string backend;  // Backend::describe(): the device and its implementation mode
  int64_t batch = 0;
  int steps = 0;
  DevicePeaks peaks;
  // Measured in fp32 too when some layers of a half-precision profile compute in fp32
  // arithmetic: their roof (flops_per_s 0 when not measured).
  DevicePeaks fp32_peaks;
  int fp32_arithmetic_layers = 0;
  std::vector<LayerProfile> layers;  // by time, slowest first
  double optimizer_s = 0, overflow_check_s = 0, zero_grads_s = 0;
  double layers_s = 0;           // sum of the layers
  double profiled_step_s = 0;    // sum of everything timed
  double measured_step_s = 0;    // mean step without profiling
  double timing_overhead_s = 0;  // per plan step, measured and taken off each
  double discrepancy = 0;        // (profiled_step_s - measured_step_s) / measured_step_s
  bool consistent = false;       // |discrepancy| <= kProfileMargin
  // The share of the measured steps' thread time spent waiting for a core (run delay over
  // wall time x host threads): other programs on the machine inflate every time above. NaN
  // where the kernel does not say.
  double cpu_wait_share = std::numeric_limits<double>::quiet_NaN();

  std::string table(int top = 0) const;  // top 0: every layer
  nlohmann::json to_json() const;
  // The mean step as a Chrome trace: one span per plan step laid end to end (means, not
  // one particular step).
  void write_trace(const std::string& path) const;

  std::vector<std::pair<std::string, double>> step_spans;  // plan steps in program order, mean seconds
};

ProfileReport run_profile(const ProfileOptions& options);

// The peaks of `backend`-like device in `dtype`, measured through plans of two tiny
// graphs (a GEMM, a ReLU over a large tensor).
DevicePeaks measure_peaks(DeviceChoice device, DType dtype, const BackendOptions& options = {});

}  // namespace rn

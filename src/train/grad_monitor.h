// The gradient-distribution monitor: every `interval` steps, per parameter tensor, the
// (unscaled) gradient norm, the weight norm, the update-to-weight ratio
// ||w_after - w_before|| / ||w_before||, a histogram of |gradient| on fixed logarithmic bins
// (prof/tensor_stats.h) and the fractions of zero, inf and NaN gradient values.
//
//   GradMonitor mon(model, interval, run_dir + "/grad_summary.jsonl");
//   mon.before_step(step + 1);                 // keeps a copy of the weights when due
//   bool applied = train_step.run(lr);
//   if (auto r = mon.after_step(epoch, step + 1, scale_used, applied)) metrics.append(grad_record(*r));
//
// Step 1 is always monitored, so that two runs can be compared from their initial weights.
// Each monitored step is one JSON line of the summary file (grad_summary.jsonl in the run
// folder); `resnet summary` reads and compares them (summary.h). A skipped step (overflow)
// has an update ratio of 0.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "prof/tensor_stats.h"

namespace rn {

struct LayerGradStats {
  std::string name;  // the parameter tensor: "layer1.0.conv1.weight"
  TensorStats grad;  // of the unscaled gradient
  double weight_norm = 0;
  double update_ratio = 0;
};

struct GradRecord {
  int64_t epoch = 0;  // the step's epoch, from 1
  int64_t step = 0;   // 1-based optimizer step
  double loss_scale = 1;
  bool applied = true;                 // false: skipped for inf/NaN
  std::vector<LayerGradStats> layers;  // in the model's parameter order (the classifier first)

  TensorStats total() const;  // all gradients as one tensor
  double total_weight_norm() const;
  double max_update_ratio() const;
  nlohmann::json to_json() const;
  static GradRecord from_json(const nlohmann::json& j);  // throws naming the missing field
};

// Per-tensor statistics of the model's current gradients, unscaled by 1 / loss_scale, and
// weights; `before` (the weights before the update, same layout as param_data(), or null)
// gives the update ratios.
GradRecord collect_grad_stats(const Model& model, const float* before, double loss_scale);

class GradMonitor {
 public:
  // interval 0: never due. An empty path keeps records in memory only (tests).
  GradMonitor(const Model& model, int64_t interval, std::string path);

  // Step 1 (the initial weights) and every `interval` steps.
  bool due(int64_t step) const { return interval_ > 0 && (step == 1 || step % interval_ == 0); }
  void before_step(int64_t step);
  std::optional<GradRecord> after_step(int64_t epoch, int64_t step, double loss_scale, bool applied);

 private:
  const Model& model_;
  int64_t interval_;
  std::string path_;
  std::vector<float> before_;
  bool have_before_ = false;
};

// Every record of a summary file, in order; an error names the file and line.
std::vector<GradRecord> read_grad_summary(const std::string& path);

// The compact "grad" record for metrics.jsonl (what the report plots): total gradient and
// weight norms, the largest update ratio, zero/inf/NaN fractions over all gradients.
nlohmann::json grad_metrics_fields(const GradRecord& r);

}  // namespace rn

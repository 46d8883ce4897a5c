// `resnet summary`: reads the gradient-distribution monitor's summary file
// (RUN/grad_summary.jsonl, grad_monitor.h) of one run and prints its first epoch's
// statistics per tensor, or compares two runs (CPU against GPU, fp32 against mixed
// precision, before and after a change) record by record at the steps both monitored and
// names the tensors that diverge first.
//
// Divergence of a tensor at a step: the relative difference of its weight norms and of its
// gradient norms, |a - b| / max(|a|, |b|). The first step at which any tensor passes the
// tolerance is the first divergence. If that is the first step both runs monitored (step 1,
// the initial weights) and a tensor's *weights* differ, the runs started apart (a changed
// initialisation, a corrupted checkpoint, a perturbed layer) and those tensors are named,
// by weight difference: every gradient then differs as a consequence. Otherwise the
// tensors are ranked by gradient difference (later weights differ because earlier
// gradients did).
#pragma once

#include <string>
#include <vector>

#include "train/grad_monitor.h"

namespace rn {

struct TensorDivergence {
  std::string name;
  double weight_a = 0, weight_b = 0, weight_rel = 0;
  double grad_a = 0, grad_b = 0, grad_rel = 0;
};

struct RunComparison {
  int64_t common_steps = 0;
  int64_t first_step = -1;              // -1: no divergence past the tolerance
  std::string first_tensor;             // the tensor named first
  std::string first_reason;             // "weights" or "gradients"
  bool updates_differ = false;          // weights apart right after an agreed step: its updates differed
  std::vector<TensorDivergence> worst;  // at first_step, named first then by difference
  double tolerance = 0;
  std::string text() const;
};

// Records of a summary file, one per step (a resumed run's later record of a step wins).
std::vector<GradRecord> grad_records_by_step(const std::vector<GradRecord>& records);

RunComparison compare_grad_runs(const std::vector<GradRecord>& a, const std::vector<GradRecord>& b, double tolerance);

// The first epoch's statistics of a run as a table.
std::string summarize_grad_run(const std::vector<GradRecord>& records);

// RUN (a run folder or the summary file itself) -> the summary file's path; an error names
// what is missing (and says how to turn the monitor on).
std::string grad_summary_path(const std::string& run);

}  // namespace rn

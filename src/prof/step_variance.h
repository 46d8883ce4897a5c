// Throughput-variance analysis: rolling statistics of the training step time and, when
// their spread passes a threshold, one warning that names the most likely cause with its
// evidence.
//
//   StepVarianceAnalyser v({.window = 50, .threshold = 0.10});
//   if (auto w = v.add(step, {.seconds = dt, .data_wait = wait})) log(w->text);
//
// The spread of a window is a robust coefficient of variation, (P90 - P10) / (2.563 * P50)
// of its step times (equal to std / mean for normally distributed times), so that one
// slow step (an epoch start, a checkpoint) does not count but a stretch of slow steps
// (more than a tenth of the window) does. The cause compares the slowest quarter of the
// window's steps with its fastest half: what grew between them, in seconds per step,
// explains the spread:
//   input-bound           the data-wait time grew (the loader cannot keep up)
//   communication         the all-reduce / communication time grew
//   host synchronisation  the time the host spent waiting on the device grew more than the
//                         step (a larger share of it: on a device the wait is mostly the
//                         device computing, and grows with any slower step)
//   clocks or power       the device clock (or power) was lower in the slow steps
//   CPU contention        the process's threads waited far longer for a core in the slow
//                         steps (the scheduler's run delay: more runnable threads than cores)
//   compute               none of those: the step itself varies (thermal limits the
//                         monitor does not see, a kernel's own variance)
// The warning fires once per cause when the spread passes the threshold, and again only
// after the spread has stayed below 80% of it for a whole window (a new episode). Explaining costs a sort of
// the window, and only happens while the spread is past the threshold.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace rn {

// One training step as the trainer saw it (seconds), with the device state at the time
// (NaN: not known).
struct StepSample {
  double seconds = 0;    // wall time from the end of the previous step to the end of this one
  double data_wait = 0;  // of which waiting for the loader
  double comm = 0;       // of which communication (all-reduce) not hidden behind compute
  double host_sync = 0;  // of which the host waiting for the device
  double clock_mhz = std::numeric_limits<double>::quiet_NaN();
  double power_w = std::numeric_limits<double>::quiet_NaN();
  // Seconds the process's threads spent runnable but waiting for a core during the step,
  // summed over its threads (the scheduler's run delay, /proc/self/task/*/schedstat). NaN:
  // not known.
  double cpu_wait = std::numeric_limits<double>::quiet_NaN();
  int64_t images = 0;  // samples processed (for images/s)
  // Optimizer steps the sample covers: 1, or in sink mode those since the last host
  // synchronisation (the figures above are their sums; the analysis takes them per step).
  int64_t steps = 1;
};

struct VarianceOptions {
  int window = 50;          // steps in the rolling window
  double threshold = 0.10;  // robust coefficient of variation that triggers the warning
  int warmup = 5;           // the first steps of the run are not counted (page faults, primitive creation)
};

struct VarianceWarning {
  int64_t step = 0;
  double spread = 0;  // the window's robust coefficient of variation
  std::string cause;  // "input-bound", "communication", "host synchronisation", "clocks or power", "compute"
  std::string evidence;
  std::string text;  // the warning line
};

class StepVarianceAnalyser {
 public:
  explicit StepVarianceAnalyser(VarianceOptions options = {});

  // Adds step `step`'s sample; returns a warning when the window's spread has just passed
  // the threshold.
  std::optional<VarianceWarning> add(int64_t step, const StepSample& sample);

  double window_spread() const;  // of the current window (0 until it is full)
  int64_t counted_steps() const { return count_; }
  int64_t warnings() const { return warnings_; }
  // Over every counted step of the run: the coefficient of variation (std / mean) of
  // throughput (images/s of each step; of 1/seconds when images are not given), and the
  // mean step time.
  double throughput_cv() const;
  double mean_step_seconds() const;
  // {"steps", "mean_step_s", "throughput_cv", "max_window_spread", "warnings", "causes": {...}}
  nlohmann::json summary_json() const;
  // "step time 41.2 ms mean, throughput CV 3.1% over 930 steps; no variance warnings"
  std::string summary_text() const;

 private:
  VarianceWarning explain(int64_t step, double spread) const;

  VarianceOptions options_;
  std::deque<StepSample> window_;
  int64_t seen_ = 0, count_ = 0, warnings_ = 0;
  int64_t calm_steps_ = 0;
  std::vector<std::string> episode_causes_;  // warned since the spread last fell below 80% of the threshold
  double max_spread_ = 0;
  // Welford over per-step throughput.
  double tp_mean_ = 0, tp_m2_ = 0, sec_sum_ = 0;
  int64_t steps_ = 0;  // optimizer steps the counted samples cover
  nlohmann::json causes_ = nlohmann::json::object();
};

// The robust coefficient of variation of `values` (see above); 0 for fewer than 3 values.
double robust_cv(std::vector<double> values);

}  // namespace rn

// The learning-rate schedule: a linear warmup from warmup_start_factor x peak to the peak,
// then cosine, step, poly or constant decay. lr(step) is a pure function of the step, so a
// resumed run needs nothing but the step to continue on the same curve.
//
// Steps are 0-based optimizer steps. With W warmup steps, T = epochs x steps_per_epoch
// total steps, f the start factor and p the peak:
//   step < W          lr = p * (f + (1 - f) * step / W)
//   cosine            lr = min_lr + (p - min_lr) * (1 + cos(pi * t)) / 2,  t = (step - W) / (T - W)
//   poly              lr = min_lr + (p - min_lr) * (1 - t)^poly_power
//   step              lr = p * step_gamma^k,  k = milestones m with step >= round(m * steps_per_epoch)
//   constant          lr = p
// t is clamped to [0, 1], so steps past T stay at the final value.
#pragma once

#include <cstdint>
#include <vector>

#include "train/config.h"

namespace rn {

class LrSchedule {
 public:
  // peak_lr: usually scaled_peak_lr(optimizer config, global batch).
  LrSchedule(const ScheduleConfig& cfg, double peak_lr, int64_t steps_per_epoch);

  double lr(int64_t step) const;

  double peak_lr() const { return peak_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

 private:
  double decayed(int64_t step) const;  // the decay curve alone, without warmup

  ScheduleConfig cfg_;
  double peak_;
  int64_t steps_per_epoch_, warmup_, total_;
  std::vector<int64_t> milestone_steps_;
};

}  // namespace rn

#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace rn {

LrSchedule::LrSchedule(const ScheduleConfig& cfg, double peak_lr, int64_t steps_per_epoch)
    : cfg_(cfg), peak_(peak_lr), steps_per_epoch_(steps_per_epoch) {
  RN_CHECK(steps_per_epoch > 0) << "LrSchedule: steps_per_epoch = " << steps_per_epoch;
  RN_CHECK(peak_lr >= 0) << "LrSchedule: peak lr = " << peak_lr;
  // min_lr is absolute while the peak is scaled with the global batch: a recipe's min_lr run at
  // a small batch can land above its peak, and the "decay" would then raise the rate.
  RN_CHECK((cfg.name != ScheduleKind::cosine && cfg.name != ScheduleKind::poly) || cfg.min_lr <= peak_lr)
      << "schedule.min_lr = " << cfg.min_lr << " is above the peak learning rate " << peak_lr
      << " (optimizer.base_lr scaled by the global batch / optimizer.lr_scale_batch), so the " << enum_name(cfg.name)
      << " decay would raise the rate; schedule.min_lr is absolute, not scaled with the batch: lower it";
  total_ = cfg.epochs * steps_per_epoch;
  warmup_ =
      cfg.warmup_steps > 0 ? cfg.warmup_steps : static_cast<int64_t>(std::llround(cfg.warmup_epochs * steps_per_epoch));
  for (double m : cfg.step_milestones)
    milestone_steps_.push_back(static_cast<int64_t>(std::llround(m * steps_per_epoch)));
}

double LrSchedule::decayed(int64_t step) const {
  const int64_t span = total_ - warmup_;
  const double t = span > 0 ? std::clamp(static_cast<double>(step - warmup_) / span, 0.0, 1.0) : 1.0;
  switch (cfg_.name) {
    case ScheduleKind::cosine:
      return cfg_.min_lr + (peak_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
    case ScheduleKind::poly:
      return cfg_.min_lr + (peak_ - cfg_.min_lr) * std::pow(1.0 - t, cfg_.poly_power);
    case ScheduleKind::step: {
      double lr = peak_;
      for (int64_t m : milestone_steps_)
        if (step >= m) lr *= cfg_.step_gamma;
      return lr;
    }
    case ScheduleKind::constant:
      return peak_;
  }
  RN_FAIL() << "LrSchedule: unknown schedule " << static_cast<int>(cfg_.name);
}

double LrSchedule::lr(int64_t step) const {
  RN_CHECK(step >= 0) << "LrSchedule: step " << step;
  if (step < warmup_) {
    const double f = cfg_.warmup_start_factor;
    return peak_ * (f + (1.0 - f) * static_cast<double>(step) / static_cast<double>(warmup_));
  }
  return decayed(step);
}

}  // namespace rn

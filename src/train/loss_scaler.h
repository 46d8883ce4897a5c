// Loss scaling for half-precision training. The loss is multiplied by scale() before
// backward; the optimizer multiplies the gradients by inv_scale() as it reads them, so
// unscaling costs no pass of its own. After backward:
//
//   bool overflow = scaler.check_overflow(grads, n);   // any inf or NaN
//   if (scaler.update(overflow)) optimizer.step(w, grads, lr, scale_used);
//
// where scale_used is inv_scale() read before update(). A step whose gradients overflow
// is skipped and counted under every policy (an inf would destroy the weights). Policies:
//   dynamic  overflow: scale *= backoff_factor; growth_interval clean steps in a row:
//            scale *= growth_factor (kept within [1, 2^24] unless `initial` is outside)
//   static   the scale stays at `initial`
//   none     the scale is 1
// Every change of the scale is logged as "loss scale OLD -> NEW at step S (reason)", so
// `grep "loss scale" train.log` prints the history.
#pragma once

#include <cstdint>
#include <string>

#include "ops/fused_math.h"
#include "train/config.h"

namespace rn {

class LossScaler {
 public:
  // Checkpointed state: restoring it continues the exact scale history.
  struct State {
    double scale = 1;
    int64_t step = 0;           // update() calls so far
    int64_t clean_steps = 0;    // steps since the last overflow or growth
    int64_t skipped_steps = 0;  // total steps skipped for overflow
    int64_t consecutive_skips = 0;
    bool operator==(const State&) const = default;
  };

  explicit LossScaler(const LossScaleConfig& cfg);

  float scale() const { return static_cast<float>(state_.scale); }
  float inv_scale() const { return static_cast<float>(1.0 / state_.scale); }

  // True if any of grads[0, n) is inf or NaN. Parallel over the global thread pool.
  bool check_overflow(const float* grads, int64_t n) const;

  // Records the outcome of one step; returns whether the step should be applied.
  bool update(bool overflow);

  int64_t skipped_steps() const { return state_.skipped_steps; }
  // Skips in a row: a trainer may stop when this keeps growing (NaN in the model itself).
  int64_t consecutive_skips() const { return state_.consecutive_skips; }
  // Skips in a row at which training stops as diverged (0: never): max_skips_in_a_row, plus
  // under the dynamic policy the backoffs from the highest scale to the lowest.
  int64_t skip_limit() const { return skip_limit_; }
  bool skipping_without_end() const { return skip_limit_ > 0 && state_.consecutive_skips >= skip_limit_; }
  // Why a skipped step could not be helped by the scale: "static loss scale 128", "no loss
  // scaling", "at the lowest loss scale 1"; empty while a dynamic scale can still back off.
  std::string skip_reason() const;
  LossScalePolicy policy() const { return cfg_.policy; }

  const State& state() const { return state_; }
  // The rule as the device's fused step applies it (ops/fused_math.h).
  fused::LossScaleRule rule() const;
  void set_state(const State& s);
  // set_state without the log line (the device step logs its own changes).
  void set_state_quietly(const State& s) { state_ = s; }
  // The log line of one change, as update() writes it and as the device's changes are logged
  // (`grep "loss scale" train.log` is the history): "loss scale 128 -> 256 at step 2000 (2000
  // steps without overflow)", "loss scale 256 -> 128 at step 2417 (overflow, 1 skipped in a row)".
  static std::string change_text(const fused::LossScaleChange& c);

  static constexpr double kMinScale = 1.0;
  static constexpr double kMaxScale = 16777216.0;  // 2^24

 private:
  int64_t compute_skip_limit() const;

  LossScaleConfig cfg_;
  State state_;
  int64_t skip_limit_ = 0;  // fixed by the configuration
};

// True if any of x[0, n) is inf or NaN; parallel, exact (no false negatives).
bool any_inf_or_nan(const float* x, int64_t n);

}  // namespace rn

#include "train/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "core/plural.h"
#include "core/thread_pool.h"

namespace rn {

bool any_inf_or_nan(const float* x, int64_t n) {
  // Blocks of fixed size; a block ORs its exponent tests without branching, so the loop
  // vectorises. An all-ones exponent is inf or NaN.
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::atomic<bool> found{false};
  ThreadPool::global().parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1 && !found.load(std::memory_order_relaxed); ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      uint32_t bad = 0;
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &x[i], 4);
        bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      }
      if (bad) found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load();
}

LossScaler::LossScaler(const LossScaleConfig& cfg) : cfg_(cfg) {
  switch (cfg.policy) {
    case LossScalePolicy::none:
      state_.scale = 1;
      break;
    case LossScalePolicy::static_scale:
      state_.scale = cfg.initial;
      break;
    case LossScalePolicy::dynamic:
      state_.scale = cfg.initial;
      break;
  }
  RN_CHECK(state_.scale > 0) << "LossScaler: initial loss scale " << cfg.initial;
  RN_CHECK(cfg.policy != LossScalePolicy::dynamic ||
           (cfg.backoff_factor > 0 && cfg.backoff_factor < 1 && cfg.growth_factor >= 1 && cfg.growth_interval >= 1))
      << "LossScaler: backoff_factor " << cfg.backoff_factor << ", growth_factor " << cfg.growth_factor
      << ", growth_interval " << cfg.growth_interval;
  skip_limit_ = compute_skip_limit();
  RN_LOG_INFO("loss scale {:.9g} (policy {}, initial)", state_.scale, enum_name(cfg.policy));
}

bool LossScaler::check_overflow(const float* grads, int64_t n) const { return any_inf_or_nan(grads, n); }

std::string LossScaler::change_text(const fused::LossScaleChange& c) {
  return fmt::format("loss scale {:.9g} -> {:.9g} at step {} ({})", c.from, c.to, c.step,
                     c.overflow ? fmt::format("overflow, {} skipped in a row", c.run)
                                : fmt::format("{} without overflow", counted(c.run, "step")));
}

fused::LossScaleRule LossScaler::rule() const {
  fused::LossScaleRule r;
  r.dynamic = cfg_.policy == LossScalePolicy::dynamic;
  r.backoff = cfg_.backoff_factor;
  r.growth = cfg_.growth_factor;
  r.growth_interval = cfg_.growth_interval;
  r.min_scale = std::min(kMinScale, cfg_.initial);
  r.max_scale = std::max(kMaxScale, cfg_.initial);
  return r;
}

int64_t LossScaler::compute_skip_limit() const {
  if (cfg_.max_skips_in_a_row <= 0) return 0;
  int64_t to_floor = 0;
  if (cfg_.policy == LossScalePolicy::dynamic) {
    const fused::LossScaleRule r = rule();
    to_floor = static_cast<int64_t>(std::ceil(std::log(r.max_scale / r.min_scale) / -std::log(cfg_.backoff_factor)));
  }
  return cfg_.max_skips_in_a_row + to_floor;
}

std::string LossScaler::skip_reason() const {
  switch (cfg_.policy) {
    case LossScalePolicy::none:
      return "no loss scaling";
    case LossScalePolicy::static_scale:
      return fmt::format("static loss scale {:.9g}", state_.scale);
    case LossScalePolicy::dynamic:
      break;
  }
  return state_.scale <= rule().min_scale ? fmt::format("at the lowest loss scale {:.9g}", state_.scale) : "";
}

// The arithmetic is fused::loss_scale_update, the same function the device's fused step
// runs; here it is wrapped with the log lines.
bool LossScaler::update(bool overflow) {
  const fused::LossScaleCounters before{state_.scale, state_.step, state_.clean_steps, state_.skipped_steps,
                                        state_.consecutive_skips};
  fused::LossScaleCounters c = before;
  const bool applied = fused::loss_scale_update(c, rule(), overflow);
  // The device's fused step records its changes as the same entries (ops/fused_math.h).
  if (c.scale != before.scale) RN_LOG_INFO("{}", change_text(fused::scale_change(before, c, overflow)));
  // A skip the scale did not answer with a backoff: it cannot be helped by the scale.
  if (overflow)
    if (const std::string why = skip_reason(); !why.empty())
      RN_LOG_WARN("step {} skipped: inf/NaN gradients ({}; {} in a row)", state_.step + 1, why, c.consecutive_skips);
  state_.scale = c.scale;
  state_.step = c.step;
  state_.clean_steps = c.clean_steps;
  state_.skipped_steps = c.skipped_steps;
  state_.consecutive_skips = c.consecutive_skips;
  return applied;
}

void LossScaler::set_state(const State& s) {
  RN_CHECK(s.scale > 0 && s.step >= 0 && s.clean_steps >= 0 && s.skipped_steps >= 0)
      << "LossScaler: invalid restored state (scale " << s.scale << ", step " << s.step << ")";
  if (s.scale != state_.scale)
    RN_LOG_INFO("loss scale {:.9g} -> {:.9g} at step {} (restored from checkpoint)", state_.scale, s.scale, s.step);
  state_ = s;
}

}  // namespace rn

#include "train/loss_scaler.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "log_capture.h"

namespace rn {
namespace {

LossScaleConfig dynamic_config(int64_t growth_interval = 2000) {
  LossScaleConfig c;
  c.policy = LossScalePolicy::dynamic;
  c.initial = 128;
  c.growth_factor = 2;
  c.backoff_factor = 0.5;
  c.growth_interval = growth_interval;
  return c;
}

TEST(LossScaler, OverflowSkipsAndBacksOff) {
  LossScaler s(dynamic_config());
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 128.0f);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 64.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 32.0f);
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_EQ(s.consecutive_skips(), 2);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 32.0f);
  EXPECT_EQ(s.consecutive_skips(), 0);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScaler, GrowsAfterIntervalOfCleanSteps) {
  LossScaler s(dynamic_config(3));
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_TRUE(s.update(false));  // third clean step in a row
  EXPECT_EQ(s.scale(), 256.0f);
  // An overflow restarts the count: 2 clean, overflow (128), 2 clean: no growth yet.
  s.update(false);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 128.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(LossScaler, DefaultIntervalIs2000) {
  LossScaler s(LossScaleConfig{});
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 128.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(LossScaler, StaticNeverChanges) {
  LossScaleConfig c = dynamic_config(2);
  c.policy = LossScalePolicy::static_scale;
  c.initial = 1024;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.update(true));
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.skipped_steps(), 5);
}

TEST(LossScaler, NoneIsOne) {
  LossScaleConfig c = dynamic_config(1);
  c.policy = LossScalePolicy::none;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f);
  EXPECT_FALSE(s.update(true));  // still skipped: inf gradients would destroy the weights
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0f);
}

TEST(LossScaler, LogsEveryChangeWithLossScale) {
  LogCapture capture;
  LossScaler s(dynamic_config(2));
  s.update(true);   // step 1: 128 -> 64
  s.update(false);  // step 2
  s.update(false);  // step 3: 64 -> 128
  const std::string log = capture.text();
  // Steps counted from 1, as the progress lines and the device's line count them.
  EXPECT_NE(log.find("loss scale 128 -> 64 at step 1 (overflow"), std::string::npos) << log;
  EXPECT_NE(log.find("loss scale 64 -> 128 at step 3 (2 steps without overflow)"), std::string::npos) << log;
  // One line at start, one per change.
  int lines = 0;
  for (size_t p = 0; (p = log.find("loss scale", p)) != std::string::npos; ++p) ++lines;
  EXPECT_EQ(lines, 3) << log;
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a(dynamic_config(3));
  a.update(true);
  a.update(false);
  LossScaler b(dynamic_config(3));
  b.set_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.scale(), 64.0f);
  for (int i = 0; i < 2; ++i) {
    a.update(false);
    b.update(false);
  }
  EXPECT_EQ(a.scale(), 128.0f);
  EXPECT_EQ(b.state(), a.state());
  LossScaler::State bad;
  bad.scale = 0;
  EXPECT_THROW(b.set_state(bad), Error);
}

TEST(LossScaler, CheckOverflowFindsInfAndNan) {
  LossScaler s(dynamic_config());
  std::vector<float> g(300001, 1.5f);
  g[7] = std::numeric_limits<float>::max();  // large but finite
  g[8] = -std::numeric_limits<float>::denorm_min();
  EXPECT_FALSE(s.check_overflow(g.data(), static_cast<int64_t>(g.size())));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t at : {size_t{0}, size_t{70000}, g.size() - 1}) {
      std::vector<float> h = g;
      h[at] = bad;
      EXPECT_TRUE(s.check_overflow(h.data(), static_cast<int64_t>(h.size()))) << bad << " at " << at;
    }
  }
  EXPECT_FALSE(s.check_overflow(g.data(), 0));
}

}  // namespace
}  // namespace rn

// LrSchedule against values worked out by hand. Common setup: peak 0.4, 10 steps per
// epoch, 10 epochs (T = 100 steps), warmup 1 epoch (W = 10 steps) from 0.1 x peak.
#include "train/schedule.h"

#include <gtest/gtest.h>

#include "core/check.h"

namespace rn {
namespace {

ScheduleConfig base(ScheduleKind kind) {
  ScheduleConfig c;
  c.name = kind;
  c.epochs = 10;
  c.warmup_epochs = 1;
  c.warmup_steps = 0;
  c.warmup_start_factor = 0.1;
  c.min_lr = 0;
  return c;
}

constexpr double kTol = 1e-12;

TEST(LrSchedule, WarmupIsLinearFromStartFactor) {
  LrSchedule s(base(ScheduleKind::cosine), 0.4, 10);
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_EQ(s.total_steps(), 100);
  EXPECT_NEAR(s.lr(0), 0.04, kTol);   // 0.4 * 0.1
  EXPECT_NEAR(s.lr(5), 0.22, kTol);   // 0.4 * (0.1 + 0.9 * 5/10) = 0.4 * 0.55
  EXPECT_NEAR(s.lr(9), 0.364, kTol);  // 0.4 * (0.1 + 0.9 * 0.9) = 0.4 * 0.91
  EXPECT_NEAR(s.lr(10), 0.4, kTol);   // end of warmup: the decay starts at the peak
}

TEST(LrSchedule, WarmupStepsWinOverEpochs) {
  ScheduleConfig c = base(ScheduleKind::constant);
  c.warmup_steps = 4;
  LrSchedule s(c, 0.4, 10);
  EXPECT_EQ(s.warmup_steps(), 4);
  EXPECT_NEAR(s.lr(2), 0.22, kTol);  // 0.4 * (0.1 + 0.9 * 2/4)
  EXPECT_NEAR(s.lr(4), 0.4, kTol);
}

TEST(LrSchedule, FractionalWarmupEpochsAndNoWarmup) {
  ScheduleConfig c = base(ScheduleKind::constant);
  c.warmup_epochs = 0.5;  // 5 steps
  EXPECT_EQ(LrSchedule(c, 0.4, 10).warmup_steps(), 5);
  c.warmup_epochs = 0;
  LrSchedule s(c, 0.4, 10);
  EXPECT_NEAR(s.lr(0), 0.4, kTol);
}

TEST(LrSchedule, Cosine) {
  LrSchedule s(base(ScheduleKind::cosine), 0.4, 10);
  // t = (step - 10) / 90; lr = 0.4 * (1 + cos(pi t)) / 2
  EXPECT_NEAR(s.lr(40), 0.3, kTol);   // t = 1/3: cos = 0.5 -> 0.4 * 0.75
  EXPECT_NEAR(s.lr(55), 0.2, kTol);   // t = 1/2: cos = 0   -> 0.4 * 0.5
  EXPECT_NEAR(s.lr(70), 0.1, kTol);   // t = 2/3: cos = -0.5 -> 0.4 * 0.25
  EXPECT_NEAR(s.lr(100), 0.0, kTol);  // t = 1
  EXPECT_NEAR(s.lr(250), 0.0, kTol);  // clamped past the end
}

TEST(LrSchedule, CosineToMinLr) {
  ScheduleConfig c = base(ScheduleKind::cosine);
  c.min_lr = 0.04;
  LrSchedule s(c, 0.4, 10);
  EXPECT_NEAR(s.lr(55), 0.22, kTol);  // 0.04 + 0.36 * 0.5
  EXPECT_NEAR(s.lr(100), 0.04, kTol);
}

// min_lr is absolute and the peak is scaled with the batch: a min_lr above the peak would make
// the decay raise the rate, and is refused naming both; step and constant schedules ignore it.
TEST(LrSchedule, AMinLrAboveThePeakIsRefused) {
  for (ScheduleKind kind : {ScheduleKind::cosine, ScheduleKind::poly}) {
    ScheduleConfig c = base(kind);
    c.min_lr = 1;
    try {
      LrSchedule s(c, 0.00625, 10);
      ADD_FAILURE() << "accepted min_lr above the peak";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("schedule.min_lr = 1 is above the peak learning rate 0.00625"), std::string::npos) << msg;
    }
    c.min_lr = 0.00625;  // equal: a constant rate after warmup
    EXPECT_NEAR(LrSchedule(c, 0.00625, 10).lr(100), 0.00625, kTol);
  }
  for (ScheduleKind kind : {ScheduleKind::step, ScheduleKind::constant}) {
    ScheduleConfig c = base(kind);
    c.min_lr = 1;
    EXPECT_NO_THROW(LrSchedule(c, 0.1, 10));
  }
}

TEST(LrSchedule, Poly) {
  ScheduleConfig c = base(ScheduleKind::poly);
  c.poly_power = 2;
  LrSchedule s(c, 0.4, 10);
  EXPECT_NEAR(s.lr(55), 0.1, kTol);        // (1 - 1/2)^2 = 1/4
  EXPECT_NEAR(s.lr(70), 0.4 / 9.0, kTol);  // (1 - 2/3)^2 = 1/9
  EXPECT_NEAR(s.lr(100), 0.0, kTol);
  c.min_lr = 0.04;
  EXPECT_NEAR(LrSchedule(c, 0.4, 10).lr(55), 0.13, kTol);  // 0.04 + 0.36 / 4
}

TEST(LrSchedule, StepAtMilestones) {
  ScheduleConfig c = base(ScheduleKind::step);
  c.step_milestones = {3, 6};  // steps 30 and 60
  c.step_gamma = 0.1;
  LrSchedule s(c, 0.4, 10);
  EXPECT_NEAR(s.lr(10), 0.4, kTol);
  EXPECT_NEAR(s.lr(29), 0.4, kTol);
  EXPECT_NEAR(s.lr(30), 0.04, kTol);
  EXPECT_NEAR(s.lr(59), 0.04, kTol);
  EXPECT_NEAR(s.lr(60), 0.004, kTol);
  EXPECT_NEAR(s.lr(99), 0.004, kTol);
}

TEST(LrSchedule, Constant) {
  LrSchedule s(base(ScheduleKind::constant), 0.4, 10);
  EXPECT_NEAR(s.lr(50), 0.4, kTol);
  EXPECT_NEAR(s.lr(1000), 0.4, kTol);
}

TEST(LrSchedule, PureFunctionOfStep) {
  // A schedule built fresh (as after a resume) gives the same value as one that has been
  // queried step by step.
  LrSchedule a(base(ScheduleKind::cosine), 0.4, 10);
  for (int64_t i = 0; i < 77; ++i) a.lr(i);
  LrSchedule b(base(ScheduleKind::cosine), 0.4, 10);
  EXPECT_EQ(a.lr(77), b.lr(77));
}

TEST(LrSchedule, PeakLrScalesWithGlobalBatch) {
  OptimizerConfig o;
  o.base_lr = 0.1;
  o.lr_scale_batch = 256;
  EXPECT_NEAR(scaled_peak_lr(o, 1024), 0.4, kTol);  // 0.1 * 1024 / 256
  EXPECT_NEAR(scaled_peak_lr(o, 128), 0.05, kTol);
  o.lr_scale_batch = 0;
  EXPECT_NEAR(scaled_peak_lr(o, 1024), 0.1, kTol);
}

TEST(LrSchedule, RejectsBadArguments) {
  EXPECT_THROW(LrSchedule(base(ScheduleKind::cosine), 0.4, 0), Error);
  LrSchedule s(base(ScheduleKind::cosine), 0.4, 10);
  EXPECT_THROW(s.lr(-1), Error);
}

}  // namespace
}  // namespace rn

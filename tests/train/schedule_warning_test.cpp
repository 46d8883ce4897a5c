// warmup_epochs past the run is a config error; warmup_steps is checked by the trainer, which
// knows the steps per epoch, and a warmup longer than the run is said at start.
#include <gtest/gtest.h>

#include <string>

#include "log_capture.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

TEST(ScheduleWarning, AWarmupLongerThanTheRunIsSaid) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("long"));
  cfg.schedule.warmup_steps = 100;  // the run has 3 epochs x 4 steps
  cfg.validate();
  {
    LogCapture capture;
    test::train_until(cfg, 1);
    EXPECT_NE(capture.text().find("schedule.warmup_steps=100 is longer than the run (12 steps)"), std::string::npos)
        << capture.text();
  }
  // A warmup as long as the run ends one step short of the peak (its rates are peak * k / 12
  // for steps k = 0..11 of the run): said too.
  cfg = test::small_run_config(dir.file("equal"));
  cfg.schedule.warmup_steps = 12;
  cfg.validate();
  {
    LogCapture capture;
    test::train_until(cfg, 1);
    EXPECT_NE(capture.text().find("schedule.warmup_steps=12 is as long as the run (12 steps)"), std::string::npos)
        << capture.text();
  }
  cfg = test::small_run_config(dir.file("short"));
  cfg.schedule.warmup_steps = 11;
  cfg.validate();
  LogCapture capture;
  test::train_until(cfg, 1);
  EXPECT_EQ(capture.text().find("the learning rate never reaches its peak"), std::string::npos) << capture.text();
}

}  // namespace
}  // namespace rn

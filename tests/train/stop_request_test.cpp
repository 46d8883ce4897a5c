// A stop request (SIGINT, SIGTERM; request_stop() here) ends the run at the next step with a
// checkpoint, and that step is a log point: the steps since the last log line get their train
// record, so that every step's loss is in one record. (Sink mode on the emulated GPU:
// tests/ops/cuda_emulation_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "small_run.h"
#include "stop_at_load.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

TEST(StopRequest, TheStepsSinceTheLastLogLineGetTheirTrainRecord) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("stopped"));  // 3 epochs of 4 steps of 8
  cfg.data.workers = 0;
  cfg.run.log_interval_steps = 50;  // log lines at the epochs' last steps only
  cfg.validate();
  const TrainResult stopped = train(cfg, test::stop_at_load(8 * 5 + 3));  // while batch 6 loads
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_EQ(stopped.steps, 6);
  const auto records = test::train_losses(stopped.run_dir);
  ASSERT_EQ(records.size(), 2u) << "epoch 1's last step and the stop";
  ASSERT_TRUE(records.count(4) && records.count(6));

  // The same run logging every step: the stop's record is the mean of steps 5 and 6. (The stop
  // request was answered: this run is not stopped by it.)
  Config every = test::small_run_config(dir.file("every"));
  every.run.log_interval_steps = 1;
  every.validate();
  const auto each = test::train_losses(test::train_until(every, 6).run_dir);
  ASSERT_TRUE(each.count(5) && each.count(6));
  const double mean = (each.at(5) + each.at(6)) / 2;
  EXPECT_NEAR(records.at(6), mean, 1e-6 * std::abs(mean));
  EXPECT_NE(records.at(6), each.at(6));  // not the last step's loss alone
}

}  // namespace
}  // namespace rn

// A stop request (SIGINT, SIGTERM; request_stop() here) ends the run at the next step with a
// checkpoint, and that step is a log point: the steps since the last log line get their train
// record, so that every step's loss is in one record. (Sink mode on the emulated GPU:
// tests/ops/cuda_emulation_test.cpp.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "log_capture.h"
#include "small_run.h"
#include "stop_at_load.h"
#include "test_dir.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace rn {
namespace {

// The first signal asks for a stop; another within 2 s is the same request (a terminal's
// Ctrl-C reaches a rank directly and through mpirun); one 2 s or more later, the stop not yet
// answered (a set-up that blocks), ends the process as the signal would have.
TEST(StopRequestDeathTest, ASecondSignalTwoSecondsLaterEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        std::raise(SIGTERM);
        std::raise(SIGINT);
        std::fprintf(stderr, "the same request again\n");
        std::this_thread::sleep_for(std::chrono::milliseconds(2100));
        std::raise(SIGTERM);
        std::fprintf(stderr, "still alive\n");
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "the same request again");
}

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

// The kinds of a run's metrics records, with the epoch of each: "eval 1", "pipeline 2", ...
std::multiset<std::string> records_of(const std::string& run_dir, const std::string& kind) {
  std::multiset<std::string> out;
  for (const auto& r : read_metrics(run_dir + "/metrics.jsonl"))
    if (r["kind"] == kind) out.insert(kind + " " + std::to_string(r["epoch"].get<int64_t>()));
  return out;
}

// A stop request during an epoch-end evaluation ends it (a large validation set takes minutes,
// longer than a batch scheduler's grace period) with the checkpoint a stop at the epoch's last
// step writes: the resume evaluates that epoch and goes on as an uninterrupted run.
TEST(StopRequest, DuringAnEvaluationItIsLeftForTheResume) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("stopped"));  // 3 epochs of 4 steps of 8
  cfg.data.workers = 0;                                      // a sample loads when its batch is asked for
  cfg.data.val_subset = 24;                                  // 3 evaluation batches
  cfg.run.eval_interval_epochs = 1;
  cfg.validate();
  TrainOptions o;
  o.wrap_val_dataset = [](std::shared_ptr<const Dataset> d) -> std::shared_ptr<const Dataset> {
    return std::make_shared<test::StopAtLoadDataset>(std::move(d), 8 + 3);  // in the second batch
  };
  LogCapture log;
  const TrainResult stopped = train(cfg, o);
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_FALSE(stopped.complete);
  EXPECT_EQ(stopped.steps, 4);
  EXPECT_NE(log.text().find("stop requested during the evaluation after epoch 1"), std::string::npos) << log.text();
  EXPECT_TRUE(records_of(stopped.run_dir, "eval").empty()) << "an abandoned evaluation has no figures";
  EXPECT_EQ(records_of(stopped.run_dir, "pipeline"), std::multiset<std::string>{"pipeline 1"});
  EXPECT_FALSE(std::filesystem::exists(stopped.run_dir + "/checkpoints/best.safetensors"));

  TrainOptions resume;
  resume.resume_dir = stopped.run_dir;
  const TrainResult resumed = train(cfg, resume);
  EXPECT_TRUE(resumed.complete);
  EXPECT_EQ(resumed.session_steps, 8);
  EXPECT_EQ(records_of(stopped.run_dir, "eval"), (std::multiset<std::string>{"eval 1", "eval 2", "eval 3"}));
  EXPECT_EQ(records_of(stopped.run_dir, "pipeline"),
            (std::multiset<std::string>{"pipeline 1", "pipeline 2", "pipeline 3"}))
      << "the resume ran no step of epoch 1";

  // The same figures as a run that was never stopped.
  Config whole = cfg;
  whole.run.out_dir = dir.file("whole");
  whole.validate();
  const TrainResult uninterrupted = train(whole);
  EXPECT_EQ(resumed.final_eval.loss, uninterrupted.final_eval.loss);
  EXPECT_EQ(resumed.best_top1, uninterrupted.best_top1);
}

}  // namespace
}  // namespace rn

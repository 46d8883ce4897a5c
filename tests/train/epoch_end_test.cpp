// The end of an epoch: a periodic checkpoint that falls on its last step is not written twice
// (the epoch-end one follows), and a resume at an epoch's last step does not report memory for
// an epoch it ran no step of.
#include <gtest/gtest.h>

#include <string>

#include "log_capture.h"
#include "model/safetensors.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

TEST(EpochEnd, APeriodicCheckpointOnTheLastStepIsWrittenOnce) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));  // 3 epochs of 4 steps
  cfg.run.checkpoint.every_steps = 2;
  cfg.validate();
  LogCapture log;
  test::train_until(cfg, 6);
  EXPECT_EQ(log.count("step-00000002.safetensors"), 1) << log.text();
  EXPECT_EQ(log.count("step-00000004.safetensors"), 1) << log.text();
}

// Without epoch checkpoints, a periodic one due at an evaluated epoch's last step is written
// after the evaluation with its top-1, so best.safetensors can be it: written before, it never
// could, and the best was whatever the last epoch's save gave.
TEST(EpochEnd, APeriodicCheckpointAtAnEpochsEndCarriesItsEvaluation) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));  // 3 epochs of 4 steps
  cfg.run.checkpoint.every_epoch = false;
  cfg.run.checkpoint.every_steps = 4;
  cfg.run.checkpoint.keep_last = 0;
  cfg.run.eval_interval_epochs = 1;
  cfg.validate();
  LogCapture log;
  const TrainResult r = train(cfg);
  for (const char* step : {"step-00000004", "step-00000008", "step-00000012"}) {
    EXPECT_EQ(log.count("checkpoint " + r.run_dir + "/checkpoints/" + step + ".safetensors"), 1) << log.text();
    const SafetensorsFile f = SafetensorsFile::load(r.run_dir + "/checkpoints/" + step + ".safetensors");
    EXPECT_TRUE(f.metadata().count("checkpoint.top1")) << step << ": written before its epoch's evaluation";
  }
  const SafetensorsFile best = SafetensorsFile::load(r.run_dir + "/checkpoints/best.safetensors");
  EXPECT_EQ(std::stod(best.metadata().at("checkpoint.top1")), r.best_top1);
}

TEST(EpochEnd, AResumeAtAnEpochsLastStepReportsNoMemoryForIt) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 4);  // stops at the last step of epoch 1
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  resume.max_steps = 9;  // through epoch 2, into epoch 3
  LogCapture log;
  train(cfg, resume);
  EXPECT_EQ(log.text().find("after epoch 1:"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("after epoch 2:"), std::string::npos) << log.text();
}

}  // namespace
}  // namespace rn

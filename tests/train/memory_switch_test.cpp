// Switching memory levels between epochs (memory.schedule) and resuming a checkpoint at
// another level: the levels give bit-identical gradients, so neither may change a result.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace rn {
namespace {

TEST(MemorySchedule, ParsesSwitchesAndPicksTheLevelPerEpoch) {
  EXPECT_TRUE(parse_memory_schedule("").empty());
  EXPECT_TRUE(parse_memory_schedule("  ").empty());
  const auto s = parse_memory_schedule("2:O2, 5:O0");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (MemorySwitch{2, MemoryLevel::O2}));
  EXPECT_EQ(s[1], (MemorySwitch{5, MemoryLevel::O0}));
  MemoryConfig m;
  m.level = MemoryLevel::O1;
  m.schedule = "2:O2, 5:O0";
  EXPECT_EQ(memory_level_at_epoch(m, 0), MemoryLevel::O1);
  EXPECT_EQ(memory_level_at_epoch(m, 1), MemoryLevel::O1);
  EXPECT_EQ(memory_level_at_epoch(m, 2), MemoryLevel::O2);
  EXPECT_EQ(memory_level_at_epoch(m, 4), MemoryLevel::O2);
  EXPECT_EQ(memory_level_at_epoch(m, 5), MemoryLevel::O0);
}

TEST(MemorySchedule, BadSchedulesAreErrorsNamingKeyAndEntry) {
  for (const char* bad : {"O2", "x:O2", "0:O2", "5:O2, 3:O1", "5:O3", "5:O2,", "2.5:O2"}) {
    try {
      parse_memory_schedule(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("memory.schedule"), std::string::npos) << msg;
      EXPECT_NE(msg.find("EPOCH:LEVEL"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(load_config_from_string("memory:\n  schedule: '3:O4'\n"), Error);
  // A missing comma is named as written, not with its spaces dropped ('1:O22:O1').
  try {
    parse_memory_schedule("1:O2 2:O1");
    ADD_FAILURE() << "accepted a schedule without its comma";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("entry '1:O2 2:O1' holds a space"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_memory_schedule(" 2 : O2 ,5:O0 ").size(), 2u);
  EXPECT_THROW(load_config_from_string("memory:\n  level: O3\n"), Error);
  EXPECT_EQ(load_config_from_string("memory:\n  level: O2\n  schedule: 3:O1\n").memory.schedule, "3:O1");
}

Config small_config(const std::string& out_dir) { return test::small_run_config(out_dir); }

// Weights, running statistics and momentum of a run's newest checkpoint.
std::vector<char> final_state(const Config& cfg, const std::string& run_dir) {
  Model model(build_model(cfg.model.name, model_options(cfg.model)), cfg.optimizer.decay_bn_and_bias);
  ParamTable table = model.params();
  apply_optimizer_param_policy(table, cfg.optimizer);
  Optimizer opt(cfg.optimizer, table);
  CheckpointManager cm(run_dir, 0, false);
  EXPECT_TRUE(cm.latest_loadable(model, &opt).has_value()) << run_dir;
  std::vector<char> out;
  auto put = [&](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  put(model.param_data(), static_cast<size_t>(model.params().total) * sizeof(float));
  for (const auto& v : model.state_views())
    put(model.state_data() + v.offset, static_cast<size_t>(v.numel) * sizeof(float));
  put(opt.state().data(), opt.state().size() * sizeof(float));
  return out;
}

std::vector<int64_t> memory_levels_logged(const std::string& run_dir) {
  std::vector<int64_t> levels;
  for (const auto& r : read_metrics(run_dir + "/metrics.jsonl"))
    if (r.value("kind", "") == "memory") levels.push_back(r.at("level").get<int64_t>());
  return levels;
}

TEST(MemorySwitch, ScheduleMidRunGivesTheSameWeightsAsOneLevel) {
  TestDir dir;
  const Config one = small_config((dir.path() / "o1").string());
  const TrainResult a = train(one);
  Config sw = small_config((dir.path() / "switch").string());
  sw.memory.schedule = "1:O2, 2:O0";
  const TrainResult b = train(sw);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_TRUE(final_state(one, a.run_dir) == final_state(sw, b.run_dir))
      << "switching O1 -> O2 -> O0 between epochs changed the weights";
  // The measured peak is reported once per level, after its first epoch.
  EXPECT_EQ(memory_levels_logged(a.run_dir), (std::vector<int64_t>{1}));
  EXPECT_EQ(memory_levels_logged(b.run_dir), (std::vector<int64_t>{1, 2, 0}));
}

// Each level's memory line measures its own epoch: the peaks start afresh at a switch. The
// O2 line of a run that began at O0 used to carry O0's peak (its evaluation's), 3x its own.
TEST(MemorySwitch, EachLevelsPeakIsItsOwn) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.data.batch_size = 128;  // 16x16 resnet20: O0 plans about 9x O2's arena
  cfg.data.train_subset = 256;
  cfg.data.val_subset = 128;
  cfg.schedule.epochs = 2;
  cfg.run.eval_interval_epochs = 1;
  cfg.memory.level = MemoryLevel::O0;
  cfg.memory.schedule = "1:O2";
  cfg.validate();
  const TrainResult r = train(cfg);
  std::vector<double> peak, planned;
  for (const auto& rec : read_metrics(r.run_dir + "/metrics.jsonl"))
    if (rec.value("kind", "") == "memory") {
      peak.push_back(rec.at("peak_resident").get<double>());
      planned.push_back(rec.at("planned_total").get<double>());
    }
  ASSERT_EQ(peak.size(), 2u);
  ASSERT_GT(planned[0] - planned[1], 40.0 * 1048576) << "the levels must differ for the test to mean anything";
  EXPECT_LT(peak[1], peak[0] - (planned[0] - planned[1]) / 2)
      << "O2's peak " << peak[1] / 1048576 << " MiB against O0's " << peak[0] / 1048576 << " MiB";
}

TEST(MemorySwitch, CheckpointAtO1ResumesAtO2) {
  TestDir dir;
  const Config ref = small_config((dir.path() / "ref").string());
  const TrainResult a = train(ref);

  const Config cfg = small_config((dir.path() / "resumed").string());
  TrainOptions first;
  first.max_steps = 6;  // stops in the middle of the second epoch, at O1
  const TrainResult stopped = train(cfg, first);
  ASSERT_EQ(stopped.steps, 6);
  TrainOptions bad;
  bad.resume_dir = stopped.run_dir;
  bad.resume_overrides = {"data.batch_size=4"};  // another batch: refused
  EXPECT_THROW(train(cfg, bad), Error);  // only keys that cannot change results may change on resume
  TrainOptions resume;
  resume.resume_dir = stopped.run_dir;
  resume.resume_overrides = {"memory.level=O2"};
  const TrainResult b = train(cfg, resume);
  EXPECT_EQ(b.steps, a.steps);
  EXPECT_TRUE(final_state(ref, a.run_dir) == final_state(cfg, b.run_dir))
      << "a run checkpointed at O1 and resumed at O2 differs from one run at O1";
  EXPECT_EQ(load_config(stopped.run_dir + "/config.yaml").memory.level, MemoryLevel::O2) << "level not recorded";
  EXPECT_EQ(memory_levels_logged(b.run_dir).back(), 2);
}

}  // namespace
}  // namespace rn

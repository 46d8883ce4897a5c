// A resume checks the run's config.yaml (which a user may edit) against the configuration its
// checkpoint was trained with: keys that change results must agree, the others may differ.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/check.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/config.h"
#include "train/trainer.h"

namespace rn {
namespace {

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(ResumeConfig, AnEditThatChangesResultsIsRefusedOthersAreNot) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 4);
  ASSERT_EQ(a.steps, 4);
  const std::string yaml = a.run_dir + "/config.yaml";
  EXPECT_EQ(config_differences(load_config(yaml), load_config(yaml)).size(), 0u);

  replace_in_file(yaml, "base_lr: 0.2", "base_lr: 0.3");
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  resume.max_steps = 8;
  try {
    train(cfg, resume);
    ADD_FAILURE() << "resumed with an edited learning rate";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optimizer.base_lr: 0.2 -> 0.3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.pretrained="), std::string::npos) << msg;
  }
  // Put back; an edit that cannot change results (the loader's threads, the log interval) resumes.
  replace_in_file(yaml, "base_lr: 0.3", "base_lr: 0.2");
  replace_in_file(yaml, "workers: 1", "workers: 2");
  replace_in_file(yaml, "log_interval_steps: 50", "log_interval_steps: 2");
  EXPECT_EQ(train(cfg, resume).steps, 8);
  // To the end, then once more: nothing is left, and the result says the run is complete.
  TrainOptions rest;
  rest.resume_dir = a.run_dir;
  const TrainResult done = train(cfg, rest);
  EXPECT_EQ(done.steps, 12);
  EXPECT_TRUE(done.complete);
  const TrainResult again = train(cfg, rest);
  EXPECT_EQ(again.steps, 12);
  EXPECT_TRUE(again.complete);
}

// A resume of a folder that is not there, and a run folder that cannot be made, are errors
// that name the folder and the key.
TEST(ResumeConfig, MissingAndBlockedFoldersAreNamed) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  TrainOptions resume;
  resume.resume_dir = dir.file("nowhere");
  try {
    train(cfg, resume);
    ADD_FAILURE() << "resumed a folder that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot resume from '" + dir.file("nowhere") + "': no such folder"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(dir.file("a_file")) << "x";
  const Config blocked = test::small_run_config(dir.file("a_file") + "/run");
  try {
    train(blocked);
    ADD_FAILURE() << "made a run folder under a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.out_dir: cannot make the run folder '" + dir.file("a_file") + "/run'"),
              std::string::npos)
        << e.what();
  }
}

// A fresh run that fails before training starts leaves no folder: the corrected attempt gets
// the name asked for, not <out_dir>-2.
TEST(ResumeConfig, AFailedStartLeavesNoRunFolder) {
  TestDir dir;
  Config bad = test::small_run_config(dir.file("run"));
  bad.model.pretrained = dir.file("missing.safetensors");
  bad.validate();
  EXPECT_THROW(train(bad), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("run")));
  EXPECT_EQ(test::train_until(test::small_run_config(dir.file("run")), 1).run_dir, dir.file("run"));
}

}  // namespace
}  // namespace rn

// Paths that are not what they seem: a pipe given as model.pretrained is refused at once (opening
// it waited for a writer for ever, and a stop signal could not end the wait), and a run folder
// moved to a path that is not UTF-8 is refused when resumed (it trained, failed at the first
// checkpoint, and could not be resumed again).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "core/check.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

TEST(HostilePaths, APipeAsPretrainedWeightsIsRefusedWithoutWaiting) {
  TestDir dir;
  const std::string fifo = dir.file("weights.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.model.pretrained = fifo;
  const std::string e = test::train_error(cfg);
  EXPECT_NE(e.find("'" + fifo + "': not a regular file"), std::string::npos) << e;
}

TEST(HostilePaths, AResumeFromAFolderWhosePathIsNotUtf8IsRefusedAtOnce) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 1);
  const std::string moved = dir.file("run\xff");
  fs::rename(a.run_dir, moved);
  TrainOptions resume;
  resume.resume_dir = moved;
  const std::string e = test::train_error(cfg, resume);
  EXPECT_NE(e.find("the folder's path is not UTF-8 text"), std::string::npos) << e;
  // Nothing was written: config.yaml still records the old folder, and no step was added.
  EXPECT_FALSE(fs::exists(moved + "/checkpoints/step-00000002.safetensors"));
}

}  // namespace
}  // namespace rn

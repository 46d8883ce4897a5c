// One process at a time writes a run folder (run_folder_lock.h): a resume of a run that is
// still going is refused naming the holder's pid, a fresh run whose out_dir another run is
// setting up takes the next name, and a fresh run that fails before training removes only the
// folder it made itself.
#include "train/run_folder_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/check.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

TEST(RunFolderLock, AResumeOfARunInUseIsRefusedNamingThePid) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 2);
  RunFolderLock held(a.run_dir);  // as the run's own process would, still training
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  const std::string e = test::train_error(cfg, resume);
  EXPECT_NE(e.find("the run folder '" + a.run_dir + "' is in use by another resnet process (pid " +
                   std::to_string(::getpid()) + ")"),
            std::string::npos)
      << e;
  EXPECT_TRUE(fs::exists(a.run_dir + "/checkpoints/step-00000002.safetensors"));
  EXPECT_THROW(RunFolderLock again(a.run_dir), Error);
}

TEST(RunFolderLock, AFreshRunTakesTheNextNameWhileAnotherSetsTheFolderUp) {
  TestDir dir;
  fs::create_directories(dir.file("run"));
  RunFolderLock other(dir.file("run"));  // another run, before its train.log exists
  const TrainResult r = test::train_until(test::small_run_config(dir.file("run")), 1);
  EXPECT_EQ(r.run_dir, dir.file("run-2"));
}

TEST(RunFolderLock, AFailedStartKeepsAFolderTheUserMade) {
  TestDir dir;
  fs::create_directories(dir.file("mine"));
  Config cfg = test::small_run_config(dir.file("mine"));
  cfg.model.pretrained = dir.file("missing.safetensors");
  EXPECT_NE(test::train_error(cfg).find("missing.safetensors"), std::string::npos);
  ASSERT_TRUE(fs::is_directory(dir.file("mine"))) << "the user's own folder was removed";
  EXPECT_TRUE(fs::is_empty(dir.file("mine")));
  // A folder the run made itself is removed.
  cfg.run.out_dir = dir.file("made");
  EXPECT_NE(test::train_error(cfg), "");
  EXPECT_FALSE(fs::exists(dir.file("made")));
}

}  // namespace
}  // namespace rn

// A resume checks the run's config.yaml (which a user may edit) against the configuration its
// checkpoint was trained with: keys that change results must agree, the others may differ.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/check.h"
#include "data/image_folder_files.h"
#include "log_capture.h"
#include "model/safetensors.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/config.h"
#include "train/metrics.h"
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
  // Its start record is at the last epoch (it said epoch 4 of 3).
  int64_t start_epoch = 0;
  for (const auto& r : read_metrics(a.run_dir + "/metrics.jsonl"))
    if (r["kind"] == "start") start_epoch = r["epoch"].get<int64_t>();
  EXPECT_EQ(start_epoch, 3);
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

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::string error_of_train(const Config& cfg, const TrainOptions& o) {
  try {
    train(cfg, o);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "train() did not fail";
  return {};
}

// --set on a resume takes the keys an edit of config.yaml may change, and no others; a step
// limit the run has reached is an error, and the error ends train.log too.
TEST(ResumeConfig, SetTakesTheKeysThatCannotChangeResults) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 4);
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  resume.max_steps = 8;
  resume.resume_overrides = {"optimizer.base_lr=0.3"};
  std::string e = error_of_train(cfg, resume);
  EXPECT_NE(e.find("cannot change 'optimizer.base_lr' when resuming"), std::string::npos) << e;
  // The run's own value changes nothing, and is not refused.
  resume.resume_overrides = {"optimizer.base_lr=" + fmt::format("{}", cfg.optimizer.base_lr)};
  resume.max_steps = 5;
  EXPECT_EQ(train(cfg, resume).steps, 5);
  resume.max_steps = 8;

  resume.resume_overrides = {"run.threads=1", "run.log_interval_steps = 2", "data.workers=2"};
  EXPECT_EQ(train(cfg, resume).steps, 8);
  EXPECT_NE(read_file(a.run_dir + "/config.yaml").find("log_interval_steps: 2"), std::string::npos);

  // A resume that fails leaves config.yaml as it was: its --set is not written.
  resume.resume_overrides = {"run.log_interval_steps=3"};
  resume.max_steps = 6;
  e = error_of_train(cfg, resume);
  EXPECT_NE(e.find("the step limit (--max-steps) is 6 but " + a.run_dir + " is at step 8 already"), std::string::npos)
      << e;
  EXPECT_NE(read_file(a.run_dir + "/config.yaml").find("log_interval_steps: 2"), std::string::npos);
  const std::string log = read_file(a.run_dir + "/train.log");
  const size_t last_line = log.rfind('\n', log.size() - 2);
  EXPECT_NE(log.find("[error] the step limit (--max-steps) is 6", last_line), std::string::npos) << log;
}

// The image cache turned on or off at a resume changes the pixels of every later step (cached
// images are decoded at the cache's resolution): said, where it used to pass as a key that
// cannot change results. Its size alone changes nothing and is not mentioned.
TEST(ResumeConfig, TurningTheImageCacheOnOrOffIsSaid) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 2, 4);
  test::write_image_folder(dir.path() / "data/val", 2, 1);
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.model.num_classes = 2;
  cfg.model.in_channels = 3;
  cfg.data.dataset = DatasetKind::imagefolder;
  cfg.data.root = dir.file("data");
  cfg.data.train_subset = 0;
  cfg.data.val_subset = 0;
  cfg.data.batch_size = 2;
  cfg.data.mean = {0.5, 0.5, 0.5};
  cfg.data.std = {0.25, 0.25, 0.25};
  cfg.data.augment.eval_resize = 16;
  cfg.data.cache_mb = 8;
  cfg.validate();
  const TrainResult a = test::train_until(cfg, 2);
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  resume.max_steps = 3;
  resume.resume_overrides = {"data.cache_mb=16"};
  {
    LogCapture log;
    EXPECT_EQ(train(cfg, resume).steps, 3);
    EXPECT_EQ(log.text().find("data.cache_mb is"), std::string::npos) << log.text();
  }
  resume.max_steps = 4;
  resume.resume_overrides = {"data.cache_mb=0"};
  LogCapture log;
  EXPECT_EQ(train(cfg, resume).steps, 4);
  EXPECT_NE(log.text().find("data.cache_mb is 0 now and was 16 when"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("other pixels than an uninterrupted run would"), std::string::npos);
}

// A moved (or copied) run folder resumes where it is now, and its config.yaml's run.out_dir
// follows; a --set of the folder being resumed is then its own value, and accepted.
TEST(ResumeConfig, AMovedRunFolderResumesWhereItIsAndRecordsIt) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("before"));
  const TrainResult a = test::train_until(cfg, 4);
  const std::string moved = dir.file("after");
  std::filesystem::rename(a.run_dir, moved);
  TrainOptions resume;
  resume.resume_dir = moved;
  resume.max_steps = 6;
  EXPECT_EQ(train(cfg, resume).steps, 6);
  const std::string yaml = read_file(moved + "/config.yaml");
  EXPECT_NE(yaml.find("out_dir: " + moved + "\n"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find(dir.file("before")), std::string::npos) << yaml;
  EXPECT_FALSE(std::filesystem::exists(dir.file("before"))) << "nothing written where the run was";
  resume.resume_overrides = {"run.out_dir=" + moved};
  resume.max_steps = 8;
  EXPECT_EQ(train(cfg, resume).steps, 8);
  resume.resume_overrides = {"run.out_dir=" + dir.file("elsewhere")};
  resume.max_steps = 9;
  const std::string e = error_of_train(cfg, resume);
  EXPECT_NE(e.find("cannot change 'run.out_dir'"), std::string::npos) << e;
  // A fresh run records the folder it took: out_dir taken, so before-2, as an absolute path.
  test::train_until(cfg, 1);
  const TrainResult c = test::train_until(cfg, 1);
  ASSERT_EQ(c.run_dir, dir.file("before") + "-2");
  EXPECT_NE(read_file(c.run_dir + "/config.yaml").find("out_dir: " + dir.file("before") + "-2\n"), std::string::npos);
}

// A run none of whose checkpoints loads is not started again over itself: the new run's
// rotation would delete what is left of the old one.
TEST(ResumeConfig, ARunWithOnlyDamagedCheckpointsIsNotStartedAgain) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 2);
  const std::string ckpt = a.run_dir + "/checkpoints/step-00000002.safetensors";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  std::filesystem::resize_file(ckpt, 100);
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second finds the file set aside already
    const std::string e = error_of_train(cfg, resume);
    EXPECT_NE(
        e.find("cannot resume " + a.run_dir + ": none of its checkpoints loads (set aside: " + ckpt + ".damaged)"),
        std::string::npos)
        << e;
  }
}

// One flipped bit in a checkpoint's tensor data is damage too (its CRC-32 says so), not weights
// to resume from.
TEST(ResumeConfig, AFlippedBitInACheckpointIsDamage) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 2);
  const std::string ckpt = a.run_dir + "/checkpoints/step-00000002.safetensors";
  {
    std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-64, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(-64, std::ios::end);
    f.write(&c, 1);
  }
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  const std::string e = error_of_train(cfg, resume);
  EXPECT_NE(e.find("none of its checkpoints loads (set aside: " + ckpt + ".damaged)"), std::string::npos) << e;
}

// So is one in its header: a step "2" read as "3" would resume at the wrong place in the
// schedule with no word said (the header's CRC-32 finds it).
TEST(ResumeConfig, AFlippedBitInACheckpointHeaderIsDamage) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 2);
  const std::string ckpt = a.run_dir + "/checkpoints/step-00000002.safetensors";
  {
    std::string bytes = read_file(ckpt);
    const size_t at = bytes.find("\"train.step\":\"2\"");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 14] = '3';  // '2' ^ 0x01
    std::ofstream(ckpt, std::ios::binary | std::ios::trunc) << bytes;
  }
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  const std::string e = error_of_train(cfg, resume);
  EXPECT_NE(e.find("none of its checkpoints loads (set aside: " + ckpt + ".damaged)"), std::string::npos) << e;
  EXPECT_NE(read_file(a.run_dir + "/train.log").find("the header is damaged"), std::string::npos);
}

// A position that does not parse is damage as well, and the next older file is taken: a file
// without a header CRC (older builds wrote none) can hold a flipped bit there. Resealed here, so
// that the CRC passes and the parse is what finds it.
TEST(ResumeConfig, AnUnparseablePositionIsDamageAndTheNextOlderFileIsTaken) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 2);
  TrainOptions resume;
  resume.resume_dir = a.run_dir;
  resume.max_steps = 4;
  ASSERT_EQ(train(cfg, resume).steps, 4);
  const std::string ckpt = a.run_dir + "/checkpoints/step-00000004.safetensors";
  {
    std::string bytes = read_file(ckpt);
    const size_t at = bytes.find("\"train.step\":\"4\"");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 14] = '&';
    ASSERT_TRUE(reseal_header_crc(bytes));
    std::ofstream(ckpt, std::ios::binary | std::ios::trunc) << bytes;
  }
  resume.max_steps = 5;
  EXPECT_EQ(train(cfg, resume).steps, 5);
  const std::string log = read_file(a.run_dir + "/train.log");
  EXPECT_NE(log.find("skipping damaged checkpoint '" + ckpt + "': checkpoint '" + ckpt +
                     "': metadata field 'train.step' = '&' is not an integer"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("resumed from " + a.run_dir + "/checkpoints/step-00000002.safetensors"), std::string::npos) << log;
  EXPECT_TRUE(std::filesystem::exists(ckpt + ".damaged"));
}

// A run whose every step overflows changes nothing any more: it stops after
// precision.loss_scale.max_skips_in_a_row skips in a row, not at the next evaluation (or the
// end of the schedule), and writes no checkpoint of weights that are no longer finite.
TEST(ResumeConfig, StepsSkippedWithoutEndStopTheRun) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.optimizer.base_lr = 1e8;
  cfg.precision.level = PrecisionLevel::O2;
  cfg.precision.loss_scale.policy = LossScalePolicy::none;
  cfg.precision.loss_scale.max_skips_in_a_row = 3;
  cfg.data.train_subset = 96;  // 12 steps an epoch
  cfg.schedule.warmup_epochs = 0;
  cfg.schedule.epochs = 2;
  cfg.run.log_interval_steps = 1;
  cfg.run.checkpoint.every_steps = 1;
  cfg.validate();
  const std::string e = error_of_train(cfg, {});
  EXPECT_NE(e.find("3 steps in a row, up to step "), std::string::npos) << e;
  EXPECT_NE(e.find("were skipped for inf/NaN gradients (no loss scaling): training diverged"), std::string::npos) << e;
  EXPECT_NE(e.find("precision.loss_scale.max_skips_in_a_row=3"), std::string::npos) << e;
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/report.html"))) << e;
  const std::string log = read_file(dir.file("run/train.log"));
  EXPECT_NE(log.find("skipped: inf/NaN gradients (no loss scaling; 1 in a row)"), std::string::npos) << log;
  EXPECT_EQ(log.find("epoch 2/2"), std::string::npos) << "ran on past the limit";
  EXPECT_NE(log.find("no checkpoint at step 3: 'layer1.0.bn1.running_var' holds inf or NaN values"), std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/checkpoints/step-00000003.safetensors")));
  // 0: never stop. Here the run then "finishes" (an infinite running variance normalises to 0,
  // so even the evaluation's loss is finite): what the limit is there for.
  cfg.precision.loss_scale.max_skips_in_a_row = 0;
  cfg.run.out_dir = dir.file("run0");
  EXPECT_EQ(train(cfg).steps, 24);
}

// A fresh run does not write into a folder of other files (it would replace their report.html,
// config.yaml, ...); an empty folder is fine. A run stopped mid-epoch leaves its trace.
TEST(ResumeConfig, AFreshRunNeedsANewOrEmptyFolder) {
  TestDir dir;
  std::filesystem::create_directories(dir.file("proj/src"));
  std::ofstream(dir.file("proj/report.html")) << "mine";
  const std::string e = error_of_train(test::small_run_config(dir.file("proj")), {});
  EXPECT_NE(e.find("run.out_dir: '" + dir.file("proj") + "' is a folder that holds other files"), std::string::npos)
      << e;
  EXPECT_EQ(read_file(dir.file("proj/report.html")), "mine");
  EXPECT_FALSE(std::filesystem::exists(dir.file("proj/train.log")));

  std::filesystem::create_directories(dir.file("empty"));
  Config traced = test::small_run_config(dir.file("empty"));
  traced.run.trace = true;
  const TrainResult r = test::train_until(traced, 1);  // stops in the first epoch
  EXPECT_EQ(r.run_dir, dir.file("empty"));
  EXPECT_NE(read_file(r.run_dir + "/trace.json").find("\"step 1\""), std::string::npos);
}

// Weights that give no finite loss end the run with an error, not with "finished" and a best
// checkpoint.
TEST(ResumeConfig, ADivergedRunIsAnError) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.optimizer.base_lr = 1e8;
  cfg.precision.level = PrecisionLevel::O2;  // bf16 activations overflow soon; the steps are skipped
  cfg.precision.loss_scale.policy = LossScalePolicy::none;
  cfg.data.train_subset = 64;
  cfg.schedule.warmup_epochs = 0;
  cfg.schedule.epochs = 1;
  cfg.validate();
  const std::string e = error_of_train(cfg, {});
  EXPECT_NE(e.find("diverged"), std::string::npos) << e;
  EXPECT_NE(e.find("is not finite (NaN"), std::string::npos) << e;
  // The run that most needs its report has one, and the error names it.
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/report.html"))) << e;
  EXPECT_NE(e.find("; report: " + dir.file("run") + "/report.html"), std::string::npos) << e;
}

}  // namespace
}  // namespace rn

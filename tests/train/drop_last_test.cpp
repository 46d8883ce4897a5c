// data.drop_last=false: training steps run whole batches, so a last partial batch is refused
// when the run starts (not when the first epoch ends), and samples that fill every batch train.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace rn {
namespace {

TEST(DropLast, APartialTrainingBatchIsRefusedAtStart) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("partial"));
  cfg.data.drop_last = false;
  cfg.data.train_subset = 36;  // 4 batches of 8 and 4 left over
  cfg.validate();
  try {
    test::train_until(cfg, 1);  // one step: the old check fired only at the end of epoch 1
    ADD_FAILURE() << "a run with a partial last batch started";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("data.drop_last=false: this rank's 36 training samples an epoch leave a last batch of 4 of 8"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("set data.drop_last=true"), std::string::npos) << what;
  }
  cfg = test::small_run_config(dir.file("whole"));
  cfg.data.drop_last = false;  // 32 samples: 4 whole batches
  cfg.validate();
  const TrainResult r = test::train_until(cfg, 5);
  EXPECT_EQ(r.steps, 5);
}

}  // namespace
}  // namespace rn

// The NVTX ranges a profiler such as Nsight Systems sees, through the real binary and an
// injection library that records them (tests/cli/nvtx_recorder, loaded as nsys loads its
// own): every plan step by name and balanced on its thread, the trainer's phases one at a
// time, and the loader's worker threads named, each batch a range.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "nvtx_record.h"
#include "resnet_process.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

TEST(NvtxCli, TrainingShowsPlanStepsPhasesAndLoaderThreadsByName) {
#ifndef RN_NVTX_RECORDER
  GTEST_SKIP() << "built without the NVTX headers (RN_NVTX off or no CUDA toolkit): no ranges to record";
#else
  const fs::path dir = fs::path(RN_BINARY_DIR) / "test_runs" / "nvtx_cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path record = dir / "nvtx.txt";
  std::vector<std::string> args = {"train", "--max-steps", "3"};
  for (const std::string& s :
       {std::string("model.image_size=[8, 8]"), std::string("data.dataset=synthetic"),
        std::string("data.train_subset=64"), std::string("data.val_subset=16"), std::string("data.batch_size=16"),
        std::string("data.workers=1"), std::string("data.mean=[0.5]"), std::string("data.std=[0.25]"),
        std::string("run.threads=1"), "run.out_dir=" + (dir / "run").string()}) {
    args.push_back("--set");
    args.push_back(s);
  }
  ::setenv("NVTX_INJECTION64_PATH", RN_NVTX_RECORDER, 1);
  ::setenv("RN_NVTX_RECORD", record.c_str(), 1);
  const int status = test::wait_for(test::spawn(args, dir / "train.log"));
  ::unsetenv("NVTX_INJECTION64_PATH");
  ::unsetenv("RN_NVTX_RECORD");
  ASSERT_EQ(status, 0) << test::read_all(dir / "train.log");
  ASSERT_TRUE(fs::exists(record)) << "the injection library was not loaded";

  const test::NvtxRecord r = test::parse_nvtx_record(test::read_all(record));
  for (const std::string& e : r.errors) ADD_FAILURE() << e;

  // Plan steps by name: each of 3 training steps runs the forward and backward of every
  // layer (evaluation plans add forwards of their own).
  for (const char* step : {"fwd conv1", "fwd bn1", "fwd layer1.0.conv1", "fwd fc", "fwd loss", "bwd loss",
                           "bwd_weights fc", "bwd_data fc", "bwd_weights conv1", "bwd_data layer1.0.conv1"})
    EXPECT_GE(r.pushed.count(step), 3u) << step;
  EXPECT_EQ(r.pushed.count("bwd_weights conv1"), 3u) << "one backward per training step";

  // The trainer's phases, in the order one step goes through them.
  auto first = [&](const std::string& name, size_t from) {
    for (size_t i = from; i < r.phases.size(); ++i)
      if (r.phases[i] == name) return i;
    return r.phases.size();
  };
  ASSERT_FALSE(r.phases.empty()) << "no phase ranges";
  const size_t wait = first("waiting for a batch", 0);
  const size_t fwd = first("forward", wait);
  const size_t bwd = first("backward", fwd);
  const size_t opt = first("optimizer", bwd);
  const size_t agree = first("agreeing on the step's loss", opt);
  EXPECT_LT(agree, r.phases.size()) << "phases out of order or missing";
  EXPECT_EQ(r.phases.front(), "setting up");
  EXPECT_EQ(r.phases.back(), "finished");

  // The loaders' worker threads by name, and the batches the training loader's filled as
  // ranges on it.
  int worker = 0;
  bool val_worker = false;
  for (const auto& [tid, name] : r.thread_names) {
    if (name == "train loader worker 0") worker = tid;
    val_worker = val_worker || name == "val loader worker 0";
  }
  EXPECT_TRUE(val_worker) << "no thread named \"val loader worker 0\"";
  ASSERT_NE(worker, 0) << "no thread named \"train loader worker 0\"";
  ASSERT_TRUE(r.pushed_on.count(worker)) << "the training loader's worker pushed no range";
  EXPECT_GE(r.pushed_on.at(worker).count("load batch"), 3u);
#endif
}

}  // namespace
}  // namespace rn

// The NVTX ranges a profiler such as Nsight Systems sees, through the real binary and an
// injection library that records them (tests/cli/nvtx_recorder, loaded as nsys loads its
// own): every plan step by name and balanced on its thread, the trainer's phases one at a
// time, and the loader's worker threads named, each batch a range.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "resnet_process.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

struct Recorded {
  std::multiset<std::string> pushed;                    // every range pushed, by name
  std::vector<std::string> phases;                      // started ranges, in order
  std::map<int, std::string> thread_names;              // tid -> name
  std::map<int, std::multiset<std::string>> pushed_on;  // tid -> ranges it pushed
  std::vector<std::string> errors;                      // what broke the rules
};

// Checks the rules as it reads: a pop ends a range its thread pushed, an end ends a started
// range once, no more than one phase is open at a time, and nothing is left open but the
// last phase.
Recorded parse(const std::string& text) {
  Recorded r;
  std::map<int, std::vector<std::string>> stacks;
  std::map<unsigned long long, std::string> open;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int tid = 0;
    std::string what;
    ls >> tid >> what;
    std::string rest;
    if (what == "push") {
      std::getline(ls >> std::ws, rest);
      stacks[tid].push_back(rest);
      r.pushed.insert(rest);
      r.pushed_on[tid].insert(rest);
    } else if (what == "pop") {
      if (stacks[tid].empty())
        r.errors.push_back("thread " + std::to_string(tid) + " popped with nothing pushed");
      else
        stacks[tid].pop_back();
    } else if (what == "start") {
      unsigned long long id = 0;
      ls >> id;
      std::getline(ls >> std::ws, rest);
      if (!open.empty()) r.errors.push_back("phase \"" + rest + "\" started while another was open");
      open[id] = rest;
      r.phases.push_back(rest);
    } else if (what == "end") {
      unsigned long long id = 0;
      ls >> id;
      if (open.erase(id) != 1) r.errors.push_back("end of range " + std::to_string(id) + ", which is not open");
    } else if (what == "thread") {
      unsigned named = 0;
      ls >> named;
      std::getline(ls >> std::ws, rest);
      r.thread_names[static_cast<int>(named)] = rest;
    } else {
      r.errors.push_back("unknown line: " + line);
    }
  }
  for (const auto& [tid, stack] : stacks)
    if (!stack.empty())
      r.errors.push_back("thread " + std::to_string(tid) + " left " + std::to_string(stack.size()) +
                         " ranges open, the innermost \"" + stack.back() + "\"");
  if (open.size() > 1) r.errors.push_back(std::to_string(open.size()) + " phases left open");
  return r;
}

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

  const Recorded r = parse(test::read_all(record));
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

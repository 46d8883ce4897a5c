// The troubleshooting commands through the real binary: `resnet doctor` exits 2 past its
// thresholds and writes its JSON, `resnet profile` writes a consistent JSON and a Chrome
// trace, `resnet summary` summarises and compares runs and names a missing summary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "resnet_process.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(RN_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs `resnet args...` with stdout and stderr to `log` (a fresh file); returns the exit status.
int run(const std::vector<std::string>& args, const fs::path& log) {
  fs::remove(log);
  return test::wait_for(test::spawn(args, log));
}
using test::read_all;

// resnet20 on 8x8 synthetic images, one thread.
std::vector<std::string> small(const std::string& cmd, std::vector<std::string> extra) {
  std::vector<std::string> a = {cmd};
  for (const char* s :
       {"model.image_size=[8, 8]", "data.dataset=synthetic", "data.train_subset=160", "data.val_subset=32",
        "data.batch_size=16", "data.workers=1", "data.mean=[0.5]", "data.std=[0.25]", "run.threads=1"}) {
    a.push_back("--set");
    a.push_back(s);
  }
  for (auto& e : extra) a.push_back(e);
  return a;
}

TEST(DiagCli, DoctorExitsTwoOnPlantedUnderflowAndZeroAtTheRecommendedScale) {
  const fs::path dir = fresh_dir("doctor_cli");
  const std::vector<std::string> fp16 = {"--set", "precision.level=O2", "--set", "precision.half_dtype=fp16", "--steps",
                                         "2"};
  auto args = small("doctor", fp16);
  for (const std::string& s :
       std::vector<std::string>{"--set", "precision.loss_scale.initial=1e-9", "--json", (dir / "bad.json").string()})
    args.push_back(s);
  ASSERT_EQ(run(args, dir / "bad.log"), 2) << read_all(dir / "bad.log");
  const std::string out = read_all(dir / "bad.log");
  EXPECT_NE(out.find("verdict: FAIL: underflow"), std::string::npos) << out;
  EXPECT_NE(out.find("computes in"), std::string::npos);
  const auto j = nlohmann::json::parse(read_all(dir / "bad.json"));
  EXPECT_FALSE(j["pass"].get<bool>());
  const double rec = j["recommended_scale"].get<double>();
  EXPECT_GT(rec, 1e-9);

  args = small("doctor", fp16);
  for (const std::string& s :
       std::vector<std::string>{"--set", "precision.loss_scale.initial=" + nlohmann::json(rec).dump(), "--json",
                                (dir / "good.json").string()})
    args.push_back(s);
  EXPECT_EQ(run(args, dir / "good.log"), 0) << read_all(dir / "good.log");
  EXPECT_NE(read_all(dir / "good.log").find("verdict: OK"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(read_all(dir / "good.json"))["pass"].get<bool>());
  EXPECT_NE(nlohmann::json::parse(read_all(dir / "good.json"))["backend"].get<std::string>().find("high_performance"),
            std::string::npos);

  // run.implementation_mode reaches the backend the doctor runs on.
  args = small("doctor", fp16);
  for (const std::string& s : std::vector<std::string>{"--set", "run.implementation_mode=high_precision", "--json",
                                                       (dir / "precise.json").string()})
    args.push_back(s);
  const int precise_rc = run(args, dir / "precise.log");
  EXPECT_TRUE(precise_rc == 0 || precise_rc == 2) << read_all(dir / "precise.log");  // 2: the verdict, not an error
  EXPECT_NE(read_all(dir / "precise.log").find("implementation mode high_precision"), std::string::npos)
      << read_all(dir / "precise.log");
  EXPECT_NE(nlohmann::json::parse(read_all(dir / "precise.json"))["backend"].get<std::string>().find("high_precision"),
            std::string::npos);

  // An output that cannot be written fails before the runs, not after them.
  EXPECT_EQ(run(small("doctor", {"--json", (dir / "missing" / "d.json").string()}), dir / "path.log"), 1);
  EXPECT_NE(read_all(dir / "path.log").find("the folder '" + (dir / "missing").string() + "' does not exist"),
            std::string::npos)
      << read_all(dir / "path.log");
  EXPECT_EQ(read_all(dir / "path.log").find("verdict"), std::string::npos) << read_all(dir / "path.log");
  EXPECT_EQ(run(small("doctor", {"--set", "diagnostics.doctor_max_underflow=2"}), dir / "range.log"), 1);
  EXPECT_NE(read_all(dir / "range.log").find("diagnostics.doctor_max_underflow"), std::string::npos);
}

TEST(DiagCli, ProfileWritesJsonAndTrace) {
  const fs::path dir = fresh_dir("profile_cli");
  const std::vector<std::string> args = {"profile",
                                         "--model",
                                         "resnet20",
                                         "--input",
                                         "1x8x8",
                                         "--classes",
                                         "10",
                                         "--batch",
                                         "8",
                                         "--threads",
                                         "1",
                                         "--steps",
                                         "3",
                                         "--json",
                                         (dir / "p.json").string(),
                                         "--trace",
                                         (dir / "t.json").string()};
  ASSERT_EQ(run(args, dir / "log"), 0) << read_all(dir / "log");
  const std::string out = read_all(dir / "log");
  EXPECT_NE(out.find("peaks measured at start"), std::string::npos) << out;
  EXPECT_NE(out.find("measured step without profiling"), std::string::npos);
  const auto j = nlohmann::json::parse(read_all(dir / "p.json"));
  double sum = 0;
  for (const auto& l : j["layers"]) sum += l["fwd_s"].get<double>() + l["bwd_s"].get<double>();
  EXPECT_NEAR(sum, j["layers_s"].get<double>(), 1e-9);
  const auto trace = nlohmann::json::parse(read_all(dir / "t.json"));
  EXPECT_GT(trace["traceEvents"].size(), 50u);
  EXPECT_NE(j["backend"].get<std::string>().find("high_performance"), std::string::npos) << j["backend"];
  // --high-precision reaches the backend the profile runs on (its description says which mode).
  std::vector<std::string> precise = args;
  precise.back() = "";  // --trace: none
  precise.push_back("--high-precision");
  ASSERT_EQ(run(precise, dir / "precise.log"), 0) << read_all(dir / "precise.log");
  EXPECT_NE(read_all(dir / "precise.log").find("implementation mode high_precision"), std::string::npos);
  EXPECT_NE(nlohmann::json::parse(read_all(dir / "p.json"))["backend"].get<std::string>().find("high_precision"),
            std::string::npos);
  EXPECT_EQ(run({"profile", "--dtype", "int8"}, dir / "bad.log"), 1);
  EXPECT_NE(read_all(dir / "bad.log").find("int8"), std::string::npos);
  EXPECT_EQ(run({"profile", "--bf16-conv-arithmetic", "fast"}, dir / "bad_arith.log"), 1);
  EXPECT_NE(read_all(dir / "bad_arith.log").find("unknown --bf16-conv-arithmetic 'fast' (expected auto, native, fp32)"),
            std::string::npos)
      << read_all(dir / "bad_arith.log");
  // An output that cannot be written fails before the profile, not after it.
  // args with `option`'s value replaced.
  auto with = [&](const std::string& option, const std::string& value) {
    std::vector<std::string> a = args;
    *(std::find(a.begin(), a.end(), option) + 1) = value;
    return a;
  };
  for (const char* option : {"--trace", "--json"}) {
    const std::vector<std::string> bad_path = with(option, (dir / "missing" / "out.json").string());
    EXPECT_EQ(run(bad_path, dir / "bad_path.log"), 1);
    const std::string text = read_all(dir / "bad_path.log");
    EXPECT_NE(text.find(std::string(option) + " '" + (dir / "missing" / "out.json").string() + "': the folder"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("peaks measured at start"), std::string::npos) << "profiled first:\n" << text;
  }
  EXPECT_EQ(run(with("--json", dir.string()), dir / "folder.log"), 1);
  EXPECT_NE(read_all(dir / "folder.log").find("is a folder; give a file name"), std::string::npos)
      << read_all(dir / "folder.log");
}

TEST(DiagCli, SummaryOfOneRunAndOfTwo) {
  const fs::path dir = fresh_dir("summary_cli");
  const fs::path a = dir / "a", b = dir / "b";
  for (const fs::path& r : {a, b}) {
    auto args = small("train", {"--set", "schedule.epochs=1", "--set", "run.out_dir=" + r.string(), "--set",
                                "diagnostics.grad_monitor_interval=2", "--set", "run.deterministic=true"});
    ASSERT_EQ(run(args, r.string() + ".log"), 0) << read_all(r.string() + ".log");
  }
  ASSERT_EQ(run({"summary", a.string()}, dir / "one.log"), 0) << read_all(dir / "one.log");
  EXPECT_NE(read_all(dir / "one.log").find("first epoch (1): 6 monitored steps"), std::string::npos)
      << read_all(dir / "one.log");
  ASSERT_EQ(run({"summary", a.string(), b.string()}, dir / "two.log"), 0);
  EXPECT_NE(read_all(dir / "two.log").find("the runs agree"), std::string::npos) << read_all(dir / "two.log");
  EXPECT_EQ(run({"summary", dir.string()}, dir / "none.log"), 1);
  EXPECT_NE(read_all(dir / "none.log").find("grad_monitor_interval"), std::string::npos);
}

// A command's printed result that cannot be written (a full disk) fails the command, naming
// why, where it used to exit 0 with nothing written. stderr goes to `log`.
TEST(DiagCli, AResultThatCannotBeWrittenIsAFailure) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const fs::path dir = fresh_dir("dev_full_cli");
  const fs::path log = dir / "stderr.log";
  pid_t pid = fork();
  if (pid == 0) {
    FILE* out = std::fopen("/dev/full", "w");
    FILE* err = std::fopen(log.c_str(), "w");
    if (out && err) {
      dup2(fileno(out), 1);
      dup2(fileno(err), 2);
      execl(test::resnet_path(), test::resnet_path(), "info", "--model", "resnet20", static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  EXPECT_EQ(test::wait_for(pid), 1);
  EXPECT_NE(read_all(log).find("resnet: error: writing to standard output failed: No space left on device"),
            std::string::npos)
      << read_all(log);
}

}  // namespace
}  // namespace rn

// `resnet train` on the cuda backend in the CPU emulation (resnet_sim: the CLI linked with
// src/backends/cuda/sim, docs/gpu.md): the whole device training path runs here in CI, the
// device input (pinned batches, the uploader, crop/flip/normalise on the device), the cuda
// ops, the fused step with its loss scaling on the device, sink mode's graph capture and
// replay, and the read-back of the metrics.
//  - fp32 (O0): the same losses, step by step, as the cpu backend on the same data;
//  - fp16 (O2) with memory level O2 (batch-norm recompute): losses near fp32's, and the loss
//    scale and precision level in the log;
//  - sink mode (the step captured once, replayed, the host synchronising every 2 steps)
//    ends with the eager run's weights, bit for bit (what scripts/gpu-check.sh checks on a
//    GPU).
#ifdef RN_HAVE_RESNET_SIM
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "resnet_process.h"
#include "train/metrics.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

const char* resnet_sim_path() { return RN_BINARY_DIR "/resnet_sim"; }

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(RN_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d;
}

// A few steps of resnet20 on 16x16 synthetic images, a loss every step.
std::vector<std::string> tiny_run(const fs::path& dir, const std::string& device, std::vector<std::string> extra) {
  std::vector<std::string> a = {"train"};
  for (const std::string& s : std::vector<std::string>{
           "run.out_dir=" + dir.string(), "run.device=" + device, "model.name=resnet20", "model.in_channels=3",
        "model.num_classes=10", "model.image_size=[16,16]", "data.dataset=synthetic", "data.train_subset=64",
        "data.val_subset=16", "data.batch_size=16", "data.workers=1", "data.mean=[0.5,0.5,0.5]",
        "data.std=[0.25,0.25,0.25]", "schedule.epochs=1", "run.threads=2", "run.log_interval_steps=1",
        "run.deterministic=true", "run.checkpoint.keep_best=false"}) {
    a.push_back("--set");
    a.push_back(s);
  }
  for (auto& e : extra) {
    a.push_back("--set");
    a.push_back(e);
  }
  return a;
}

// Runs `binary args`, output to dir.log; the exit status.
int run(const char* binary, const std::vector<std::string>& args, const fs::path& dir) {
  std::string cmd = std::string(binary);
  for (const auto& a : args) cmd += " '" + a + "'";
  // The emulation is built with the address sanitizer; its leak check at exit is not this
  // test's business (the kernel tests keep it).
  cmd = "ASAN_OPTIONS=detect_leaks=0 " + cmd + " > '" + dir.string() + ".log' 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::map<int64_t, double> train_losses(const fs::path& dir) {
  std::map<int64_t, double> losses;
  for (const auto& rec : read_metrics((dir / "metrics.jsonl").string()))
    if (rec.value("kind", "") == "train" && rec.contains("loss"))
      losses[rec.at("step").get<int64_t>()] = rec.at("loss").get<double>();
  return losses;
}

TEST(CudaEmulationE2E, Fp32TrainingMatchesTheCpuBackendStepByStep) {
  const fs::path cpu = fresh_dir("cuda_emulation/cpu_fp32"), cuda = fresh_dir("cuda_emulation/cuda_fp32");
  ASSERT_EQ(run(RN_BINARY_DIR "/resnet", tiny_run(cpu, "cpu", {"precision.level=O0"}), cpu), 0)
      << test::read_all(cpu.string() + ".log");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(cuda, "cuda", {"precision.level=O0"}), cuda), 0)
      << test::read_all(cuda.string() + ".log");
  const auto a = train_losses(cpu), b = train_losses(cuda);
  ASSERT_GE(a.size(), 4u);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    // fp32 both; oneDNN and the emulation's convolutions sum in other orders (and the
    // emulation in double), so a few fp32 units per step, growing with the steps.
    EXPECT_NEAR(b.at(step), loss, 1e-4 * std::fabs(loss) * static_cast<double>(step)) << "step " << step;
  }
  EXPECT_NE(test::read_all(cuda / "train.log").find("cuda backend: CUDA emulation on the CPU"), std::string::npos);
}

TEST(CudaEmulationE2E, Fp16O2WithBatchNormRecomputeTrainsAndShowsItsLossScale) {
  const fs::path f32 = fresh_dir("cuda_emulation/cuda_fp32_ref"), f16 = fresh_dir("cuda_emulation/cuda_fp16_o2");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(f32, "cuda", {"precision.level=O0"}), f32), 0)
      << test::read_all(f32.string() + ".log");
  ASSERT_EQ(run(resnet_sim_path(),
                tiny_run(f16, "cuda", {"precision.level=O2", "precision.half_dtype=fp16", "memory.level=O2"}), f16),
            0)
      << test::read_all(f16.string() + ".log");
  const auto a = train_losses(f32), b = train_losses(f16);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(b.at(step), loss, 2e-2 * std::fabs(loss)) << "step " << step << ": fp16 against fp32";
  }
  const std::string log = test::read_all(f16 / "train.log");
  EXPECT_NE(log.find("loss scale"), std::string::npos) << "the loss-scale history is logged";
  EXPECT_NE(log.find("O2"), std::string::npos) << "the precision level is shown";
}

TEST(CudaEmulationE2E, SinkModeEndsWithTheEagerWeightsBitForBit) {
  const fs::path eager = fresh_dir("cuda_emulation/eager"), sink = fresh_dir("cuda_emulation/sink");
  const std::vector<std::string> o2 = {"precision.level=O2", "precision.half_dtype=fp16",
                                       "run.implementation_mode=high_precision"};
  auto with = [&](std::string extra) {
    std::vector<std::string> v = o2;
    v.push_back(std::move(extra));
    return v;
  };
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(eager, "cuda", with("run.sink_size=0")), eager), 0)
      << test::read_all(eager.string() + ".log");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(sink, "cuda", with("run.sink_size=2")), sink), 0)
      << test::read_all(sink.string() + ".log");
  EXPECT_NE(test::read_all(sink / "train.log").find("sink mode"), std::string::npos);
  const fs::path last = fs::path("checkpoints") / "step-00000004.safetensors";
  const SafetensorsFile a = SafetensorsFile::load((eager / last).string()), b = SafetensorsFile::load((sink / last).string());
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const SafetensorsEntry& e : a.entries()) {
    ASSERT_NE(b.find(e.name), nullptr) << e.name;
    const auto x = a.raw(e.name), y = b.raw(e.name);
    EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << e.name << " differs";
  }
  EXPECT_EQ(train_losses(eager), train_losses(sink));
}

}  // namespace
}  // namespace rn
#endif  // RN_HAVE_RESNET_SIM

// `resnet train` on the cuda backend in the CPU emulation (resnet_sim: the CLI linked with
// src/backends/cuda/sim, docs/gpu.md): the whole device training path runs here in CI, the
// device input (pinned batches, the uploader, crop/flip/normalise on the device), the cuda
// ops, the fused step with its loss scaling on the device, sink mode's graph capture and
// replay, and the read-back of the metrics.
//  - fp32 (O0): the losses and every checkpoint tensor (weights, momentum) of the ref
//    backend (plain loops, fp64 sums: the same at any thread count) on the same data;
//  - fp16 (O2) with memory level O2 (batch-norm recompute): losses near fp32's, the device's
//    loss scale growing and logged, the precision level shown;
//  - sink mode (the step captured once, replayed, the host synchronising every 2 steps, a
//    log line every 4) ends with the eager run's weights and scaler bit for bit and logs
//    the same losses (what scripts/gpu-check.sh checks on a GPU).
#ifdef RN_HAVE_RESNET_SIM
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
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

// A few steps of resnet20 on 16x16 synthetic images, a loss every step (unless `extra` says
// otherwise: later settings win).
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

// Runs `binary args`, output to dir.log; the exit status. `algo_cache`: RN_CUDNN_ALGO_CACHE
// ("-": in memory only).
int run(const char* binary, const std::vector<std::string>& args, const fs::path& dir,
        const std::string& algo_cache = "-") {
  std::string cmd = std::string(binary);
  for (const auto& a : args) cmd += " '" + a + "'";
  // The emulation is built with the address sanitizer; its leak check at exit is not this
  // test's business (the kernel tests keep it). The algorithm cache stays in memory.
  cmd = "ASAN_OPTIONS=detect_leaks=0 RN_CUDNN_ALGO_CACHE='" + algo_cache + "' " + cmd + " > '" + dir.string() +
        ".log' 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::map<int64_t, double> train_losses(const fs::path& dir) {
  std::map<int64_t, double> losses;
  for (const auto& rec : read_metrics((dir / "metrics.jsonl").string()))
    if (rec.value("kind", "") == "train" && rec.contains("loss"))
      losses[rec.at("step").get<int64_t>()] = rec.at("loss").get<double>();
  return losses;
}

// The fp32 tensors of two checkpoints: within `rel` of the tensor's largest magnitude.
void expect_close_tensors(const fs::path& a_path, const fs::path& b_path, double rel) {
  const SafetensorsFile a = SafetensorsFile::load(a_path.string()), b = SafetensorsFile::load(b_path.string());
  ASSERT_EQ(a.entries().size(), b.entries().size());
  size_t compared = 0;
  for (const SafetensorsEntry& e : a.entries()) {
    ASSERT_NE(b.find(e.name), nullptr) << e.name;
    if (e.dtype_tag != "F32") continue;
    const Tensor x = a.view(e.name), y = b.view(e.name);
    ASSERT_EQ(x.numel(), y.numel()) << e.name;
    double largest = 0, worst = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(x.ptr<float>()[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(x.ptr<float>()[i]) - y.ptr<float>()[i]));
    }
    EXPECT_LE(worst, rel * largest + 1e-12) << e.name << ": largest " << largest;
    ++compared;
  }
  EXPECT_GT(compared, 50u) << "weights, buffers and momentum";
}

TEST(CudaEmulationE2E, Fp32TrainingMatchesTheReferenceBackend) {
  const fs::path ref = fresh_dir("cuda_emulation/ref_fp32"), cuda = fresh_dir("cuda_emulation/cuda_fp32");
  ASSERT_EQ(run(RN_BINARY_DIR "/resnet", tiny_run(ref, "ref", {"precision.level=O0"}), ref), 0)
      << test::read_all(ref.string() + ".log");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(cuda, "cuda", {"precision.level=O0"}), cuda), 0)
      << test::read_all(cuda.string() + ".log");
  const auto a = train_losses(ref), b = train_losses(cuda);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(b.at(step), loss, 1e-6 * std::fabs(loss)) << "step " << step;
  }
  // Both sum in double where it matters; they agree to about 1e-6 of each tensor's largest
  // value. Dropping the weight decay moves the momentum by about 6e-4.
  const fs::path last = fs::path("checkpoints") / "step-00000004.safetensors";
  expect_close_tensors(ref / last, cuda / last, 1e-5);
  EXPECT_NE(test::read_all(cuda / "train.log").find("cuda backend: CUDA emulation on the CPU"), std::string::npos);
}

TEST(CudaEmulationE2E, Fp16O2WithBatchNormRecomputeTrainsAndShowsItsLossScale) {
  const fs::path f32 = fresh_dir("cuda_emulation/cuda_fp32_ref"), f16 = fresh_dir("cuda_emulation/cuda_fp16_o2");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(f32, "cuda", {"precision.level=O0"}), f32), 0)
      << test::read_all(f32.string() + ".log");
  // The scale grows after every clean step, on the device; the log shows each change.
  ASSERT_EQ(run(resnet_sim_path(),
                tiny_run(f16, "cuda",
                         {"precision.level=O2", "precision.half_dtype=fp16", "memory.level=O2",
                          "precision.loss_scale.growth_interval=1"}),
                f16),
            0)
      << test::read_all(f16.string() + ".log");
  const auto a = train_losses(f32), b = train_losses(f16);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(b.at(step), loss, 1e-2 * std::fabs(loss)) << "step " << step << ": fp16 against fp32";
  }
  const std::string log = test::read_all(f16 / "train.log");
  EXPECT_NE(log.find("precision O2: fp16 model"), std::string::npos) << "the precision level is shown";
  EXPECT_NE(log.find("memory level O2"), std::string::npos);
  EXPECT_NE(log.find("loss scale 128 -> 256 at step 1 (1 step without overflow)"), std::string::npos)
      << "the device's scale, logged";
  EXPECT_NE(log.find("loss scale 1024 -> 2048 at step 4 (1 step without overflow)"), std::string::npos);
  double skipped = -1;
  for (const auto& rec : read_metrics((f16 / "metrics.jsonl").string()))
    if (rec.value("kind", "") == "train") skipped = rec.at("skipped_steps").get<double>();
  EXPECT_EQ(skipped, 0.0);
}

TEST(CudaEmulationE2E, SinkModeEndsWithTheEagerWeightsBitForBit) {
  const fs::path eager = fresh_dir("cuda_emulation/eager"), sink = fresh_dir("cuda_emulation/sink");
  // Two epochs of 4 steps (an evaluation between them), a log line every 4 steps: in sink
  // mode the losses between synchronisations come from the device's record.
  auto settings = [](std::string sink_size) {
    return std::vector<std::string>{"precision.level=O2",
                                    "precision.half_dtype=fp16",
                                    "precision.loss_scale.growth_interval=2",
                                    "run.implementation_mode=high_precision",
                                    "schedule.epochs=2",
                                    "run.log_interval_steps=4",
                                    "run.sink_size=" + std::move(sink_size)};
  };
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(eager, "cuda", settings("0")), eager), 0)
      << test::read_all(eager.string() + ".log");
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(sink, "cuda", settings("2")), sink), 0)
      << test::read_all(sink.string() + ".log");
  EXPECT_NE(test::read_all(sink / "train.log").find("sink mode: the step runs as a CUDA graph"), std::string::npos);
  const fs::path last = fs::path("checkpoints") / "step-00000008.safetensors";
  const SafetensorsFile a = SafetensorsFile::load((eager / last).string()), b = SafetensorsFile::load((sink / last).string());
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const SafetensorsEntry& e : a.entries()) {
    ASSERT_NE(b.find(e.name), nullptr) << e.name;
    const auto x = a.raw(e.name), y = b.raw(e.name);
    EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << e.name << " differs";
  }
  for (const char* key : {"scaler.scale", "scaler.step", "scaler.clean_steps", "scaler.skipped_steps"})
    EXPECT_EQ(a.metadata().at(key), b.metadata().at(key)) << key;
  // Each logged loss is the mean of its 4 steps' losses; sink mode adds the ones it reads
  // together as their mean (rounded to fp32 once more), hence the few fp32 units.
  const auto la = train_losses(eager), lb = train_losses(sink);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  for (const auto& [step, loss] : la) EXPECT_NEAR(lb.at(step), loss, 1e-6 * std::fabs(loss)) << "step " << step;

  for (const fs::path& dir : {eager, sink}) {
    const std::string log = test::read_all(dir / "train.log");
    // The host reads the device's scale every 4 steps (eager) or 2 (sink); each of the 4
    // doublings is still logged once, with the step that made it.
    for (const char* change : {"loss scale 128 -> 256 at step 2 (2 steps without overflow)",
                               "loss scale 256 -> 512 at step 4 (2 steps without overflow)",
                               "loss scale 512 -> 1024 at step 6 (2 steps without overflow)",
                               "loss scale 1024 -> 2048 at step 8 (2 steps without overflow)"})
      EXPECT_EQ(count_of(log, change), 1) << dir << ": " << change;
    EXPECT_EQ(count_of(log, "] loss scale "), 4 + 1) << dir << ": the 4 changes and the initial scale";
    // Device memory is measured by the device's allocator (the host's page residency of a
    // device arena said 0), and the input pipeline's step time includes the device's.
    EXPECT_NE(log.find("measured device peak "), std::string::npos) << dir;
    EXPECT_EQ(log.find("measured device peak 0.0 MiB"), std::string::npos) << dir;
    for (const auto& rec : read_metrics((dir / "metrics.jsonl").string())) {
      if (rec.value("kind", "") == "pipeline") {
        EXPECT_GT(rec.at("step_s").get<double>(), 0.5 * rec.at("wall_s").get<double>()) << dir << ": " << rec.dump();
      }
    }
  }
}

// The doctor's mixed-precision run on the device (issue 7's GPU part): fp16 gradients
// measured through the cuda backend, not only the analytic ranges.
TEST(CudaEmulationE2E, DoctorMeasuresTheMixedRunOnTheDevice) {
  const fs::path dir = fresh_dir("cuda_emulation/doctor");
  fs::create_directories(dir);
  std::vector<std::string> args = tiny_run(dir, "cuda", {"precision.level=O2", "precision.half_dtype=fp16"});
  args[0] = "doctor";
  args.insert(args.end(), {"--steps", "2", "--json", (dir / "doctor.json").string()});
  const int rc = run(resnet_sim_path(), args, dir);
  ASSERT_TRUE(rc == 0 || rc == 2) << "exit " << rc << ": " << test::read_all(dir.string() + ".log");
  const std::string json = test::read_all(dir / "doctor.json");
  EXPECT_NE(json.find("\"mixed_ran\": true"), std::string::npos) << json.substr(0, 400);
  EXPECT_NE(test::read_all(dir.string() + ".log").find("verdict:"), std::string::npos);
}

// `resnet tune` fills the algorithm cache so that a later run with the same model, batch,
// precision and mode searches nothing, run.deterministic (whose keys are its own) included.
TEST(CudaEmulationE2E, TuneFillsTheCacheADeterministicRunThenUses) {
  const fs::path dir = fresh_dir("cuda_emulation/tune");
  fs::create_directories(dir);
  const std::string cache = (dir / "algos.tsv").string();
  auto entries = [&] {  // the file's lines less its header
    std::istringstream in(test::read_all(cache));
    int n = 0;
    for (std::string line; std::getline(in, line);) n += !line.empty() && line[0] != '#';
    return n;
  };
  ASSERT_EQ(run(resnet_sim_path(),
                {"tune", "--model", "resnet20", "--input", "3x16x16", "--classes", "10", "--batch", "16", "--precision",
                 "O0", "--deterministic"},
                dir / "tune", cache),
            0)
      << test::read_all((dir / "tune").string() + ".log");
  const int tuned = entries();
  EXPECT_GT(tuned, 20) << test::read_all(cache);
  const fs::path run_dir = dir / "train";
  ASSERT_EQ(run(resnet_sim_path(), tiny_run(run_dir, "cuda", {"precision.level=O0"}), run_dir, cache), 0)
      << test::read_all(run_dir.string() + ".log");
  EXPECT_EQ(entries(), tuned) << "the deterministic run searched shapes tune had not:\n" << test::read_all(cache);
}

// Every CUDA, cuDNN, cuBLAS and NCCL call of resnet_sim resolves to the emulation: the
// program does not even load the real libraries (a call that slipped past the emulation
// would go to them, mixing real and emulated state, as NCCL's and four CUDA event calls once
// did).
TEST(CudaEmulationE2E, TheEmulatedCliLoadsNoCudaLibrary) {
  FILE* p = popen((std::string("readelf -d ") + resnet_sim_path() + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  ASSERT_NE(out.find("(NEEDED)"), std::string::npos) << out;
  for (const char* lib : {"libcudart", "libcudnn", "libcublas", "libnccl", "libcuda."})
    EXPECT_EQ(out.find(lib), std::string::npos) << "resnet_sim needs " << lib << ":\n" << out;
}

}  // namespace
}  // namespace rn
#endif  // RN_HAVE_RESNET_SIM

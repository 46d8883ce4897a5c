// End-to-end tests of `resnet train`: the real binary on a Fashion-MNIST subset.
//  - accuracy rises well above chance in a few hundred steps (fp32, and bf16 at O2);
//  - a run killed with SIGKILL at a random moment (also during a checkpoint write) and then
//    resumed ends with weights bit-identical to an uninterrupted run.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data/idx_dataset.h"
#include "model/onnx_export.h"
#include "model/safetensors.h"
#include "python_for_tests.h"
#include "resnet_process.h"
#include "train/metrics.h"
#include "train/versions.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(RN_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d;
}

using test::read_all;
using test::spawn;
using test::wait_for;

std::vector<std::string> small_run(const fs::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> a = {"train",
                                "--set", "run.out_dir=" + dir.string(),
                                "--set", "data.train_subset=2048",
                                "--set", "data.val_subset=1000",
                                "--set", "data.batch_size=32",
                                "--set", "data.workers=1",
                                "--set", "run.threads=2",
                                "--set", "run.log_interval_steps=16",
                                "--set", "run.deterministic=true"};
  for (auto& e : extra) {
    a.push_back("--set");
    a.push_back(e);
  }
  return a;
}

double last_top1(const fs::path& dir) {
  double top1 = -1;
  for (const auto& rec : read_metrics((dir / "metrics.jsonl").string()))
    if (rec.value("kind", "") == "eval") top1 = rec.at("top1").get<double>();
  return top1;
}

bool have_data() { return fashion_mnist_available(kFashionMnistDir); }

TEST(TrainE2E, AccuracyRisesWellAboveChance) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionMnistDir;
  const fs::path dir = fresh_dir("accuracy_fp32");
  ASSERT_EQ(wait_for(spawn(small_run(dir, {"schedule.epochs=3"}), dir.string() + ".log")), 0)
      << read_all(dir.string() + ".log");
  const double top1 = last_top1(dir);
  EXPECT_GT(top1, 0.6) << "10 classes: chance is 0.1";
  EXPECT_TRUE(fs::exists(dir / "report.html"));
  EXPECT_TRUE(fs::exists(dir / "train.log"));
  EXPECT_TRUE(fs::exists(dir / "config.yaml"));
}

TEST(TrainE2E, Bf16O2Converges) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionMnistDir;
  const fs::path dir = fresh_dir("accuracy_bf16_o2");
  ASSERT_EQ(wait_for(spawn(small_run(dir, {"schedule.epochs=3", "precision.level=O2", "precision.half_dtype=bf16"}),
                           dir.string() + ".log")),
            0)
      << read_all(dir.string() + ".log");
  EXPECT_GT(last_top1(dir), 0.6);
  const std::string log = read_all(dir / "train.log");
  EXPECT_NE(log.find("precision O2"), std::string::npos) << "the active level is printed at start";
  EXPECT_NE(log.find("loss scale"), std::string::npos) << "the loss-scale policy is logged";
}

// Precision O1 on the cpu backend runs the mixed kernels end to end (convolutions writing fp32,
// batch norms writing the bf16 copies the convolutions read), in training and in evaluation.
TEST(TrainE2E, Bf16O1Converges) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionMnistDir;
  const fs::path dir = fresh_dir("accuracy_bf16_o1");
  ASSERT_EQ(wait_for(spawn(small_run(dir, {"schedule.epochs=3", "precision.level=O1", "precision.half_dtype=bf16"}),
                           dir.string() + ".log")),
            0)
      << read_all(dir.string() + ".log");
  EXPECT_GT(last_top1(dir), 0.6);
  EXPECT_NE(read_all(dir / "train.log").find("precision O1"), std::string::npos)
      << "the active level is printed at start";
}

// Compares every tensor of two checkpoints bit for bit.
void expect_same_weights(const fs::path& a, const fs::path& b) {
  const SafetensorsFile fa = SafetensorsFile::load(a.string()), fb = SafetensorsFile::load(b.string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size());
  for (const auto& e : fa.entries()) {
    const auto ra = fa.raw(e.name), rb = fb.raw(e.name);
    ASSERT_EQ(ra.size(), rb.size()) << e.name;
    EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size()), 0) << "tensor " << e.name << " differs";
  }
}

TEST(TrainE2E, KillAndResumeIsBitExact) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionMnistDir;
  const std::vector<std::string> recipe = {"schedule.epochs=2", "run.checkpoint.every_steps=8",
                                           "run.checkpoint.keep_last=0", "data.train_subset=2048"};
  const fs::path ref = fresh_dir("resume_reference");
  ASSERT_EQ(wait_for(spawn(small_run(ref, recipe), ref.string() + ".log")), 0) << read_all(ref.string() + ".log");
  const fs::path final_name = fs::path("checkpoints") / "step-00000128.safetensors";
  ASSERT_TRUE(fs::exists(ref / final_name));

  std::mt19937 gen(static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  const fs::path run = fresh_dir("resume_killed");
  const fs::path log = run.string() + ".log";
  // Kill twice at random moments once the run has made some progress, then finish it. The
  // first kill must land (the run is far from done); the second may find the run finished.
  bool finished = false;
  for (int round = 0; round < 2 && !finished; ++round) {
    const bool first = round == 0;
    pid_t pid = spawn(first ? small_run(run, recipe) : std::vector<std::string>{"train", "--resume", run.string()},
                      log);
    // Wait until a checkpoint exists (or the run ends), then a random extra delay.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        ASSERT_TRUE(!first) << "run ended before it could be killed\n" << read_all(log);
        finished = true;
        break;
      }
      if (fs::exists(run / "checkpoints") && !fs::is_empty(run / "checkpoints")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 800)(gen)));
    ::kill(pid, SIGKILL);
    wait_for(pid);
  }
  ASSERT_EQ(wait_for(spawn({"train", "--resume", run.string()}, log)), 0) << read_all(log);
  ASSERT_TRUE(fs::exists(run / final_name)) << read_all(log);
  expect_same_weights(ref / final_name, run / final_name);
}

TEST(TrainE2E, SigtermSavesACheckpointThenEvalAndExportWork) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionMnistDir;
  const fs::path dir = fresh_dir("sigterm");
  const fs::path log = dir.string() + ".log";
  pid_t pid = spawn(small_run(dir, {"schedule.epochs=50", "run.checkpoint.every_epoch=false"}), log);
  // Wait for the first progress line in train.log, then ask the run to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && read_all(dir / "train.log").find("step 16/") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_for(pid), 130) << read_all(log);
  ASSERT_TRUE(fs::exists(dir / "checkpoints")) << read_all(log);
  std::vector<fs::path> saved;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) saved.push_back(e.path());
  ASSERT_EQ(saved.size(), 1u) << "exactly the checkpoint written on SIGTERM";

  // eval with per-image predictions, from the checkpoint's embedded config.
  const fs::path csv = dir.string() + "_predictions.csv";
  ASSERT_EQ(wait_for(spawn({"eval", "--weights", saved[0].string(), "--predictions", csv.string()}, log)), 0)
      << read_all(log);
  std::ifstream f(csv);
  std::string header, line;
  std::getline(f, header);
  EXPECT_EQ(
      header,
      "index,label,class1,prob1,class2,prob2,class3,prob3,class4,prob4,class5,prob5,source,label_name,name1,name2,"
      "name3,name4,name5");
  int rows = 0;
  while (std::getline(f, line)) {
    ++rows;
    // Fashion-MNIST's class names, the label's (after the empty source) and each prediction's.
    const int label = std::stoi(line.substr(line.find(',') + 1));
    EXPECT_NE(line.find(",,\"" + fashion_mnist_class_names().at(static_cast<size_t>(label)) + "\","), std::string::npos)
        << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), '"'), 12) << line;  // 6 names, quoted
  }
  EXPECT_EQ(rows, 1000) << "one row per image of the evaluated subset";

  // export writes torchvision-named weights that load back.
  const fs::path weights = dir.string() + "_weights.safetensors";
  ASSERT_EQ(wait_for(spawn({"export", "--weights", saved[0].string(), "--out", weights.string()}, log)), 0)
      << read_all(log);
  const SafetensorsFile w = SafetensorsFile::load(weights.string());
  EXPECT_NE(w.find("layer1.0.conv1.weight"), nullptr);
  EXPECT_NE(w.find("bn1.running_var"), nullptr);
  EXPECT_EQ(w.find("optimizer.momentum.fc.weight"), nullptr);

  // .onnx: the inference graph, its input and normalisation named (tests/model checks the
  // file itself; a build without libonnx says what is missing and fails).
  const fs::path onnx_path = dir.string() + "_model.onnx";
  fs::remove(log);
  const std::string sample = dir.string() + "_sample";
  const int onnx_rc =
      wait_for(spawn({"export", "--weights", saved[0].string(), "--out", onnx_path.string(), "--sample", sample}, log));
  const std::string onnx_out = read_all(log);
  if (onnx_export_available()) {
    ASSERT_EQ(onnx_rc, 0) << onnx_out;
    EXPECT_NE(onnx_out.find("ONNX opset 13"), std::string::npos) << onnx_out;
    EXPECT_NE(onnx_out.find("input \"input\" [N, 1, 28, 28] normalised with mean 0.286"), std::string::npos)
        << onnx_out;
    EXPECT_GT(fs::file_size(onnx_path), fs::file_size(weights) / 2);
    // --sample: an input and our logits for it, which the exported graph reproduces.
    EXPECT_EQ(fs::file_size(sample + ".input.f32"), 2u * 28 * 28 * 4);
    EXPECT_EQ(fs::file_size(sample + ".logits.f32"), 2u * 10 * 4);
    const std::string check = test::python() + " " + RN_SOURCE_DIR + "/tools/onnx_check.py " + onnx_path.string() +
                              " --input " + sample + ".input.f32 --logits " + sample + ".logits.f32 > " + sample +
                              ".check 2>&1";
    if (std::system((test::python() + " -c 'import onnx, torch' >/dev/null 2>&1").c_str()) == 0) {
      EXPECT_EQ(std::system(check.c_str()), 0) << read_all(sample + ".check");
    }
  } else {
    EXPECT_NE(onnx_rc, 0);
    EXPECT_NE(onnx_out.find("libonnx-dev"), std::string::npos) << onnx_out;
  }
}

TEST(TrainE2E, UnknownConfigKeyIsAClearError) {
  const fs::path dir = fresh_dir("bad_key");
  const fs::path log = dir.string() + ".log";
  EXPECT_EQ(wait_for(spawn({"train", "--set", "optimizer.momentun=0.8", "--set", "run.out_dir=" + dir.string()}, log)),
            1);
  const std::string out = read_all(log);
  EXPECT_NE(out.find("optimizer.momentun"), std::string::npos) << out;
  EXPECT_NE(out.find("optimizer.momentum"), std::string::npos) << "suggests the closest key: " << out;
}

// `resnet --version`: the build line the runs record, then one line per library, the same as
// the library reports in this process.
TEST(TrainE2E, VersionNamesTheBuildAndLibraries) {
  const fs::path log = fresh_dir("version").string() + ".log";
  fs::remove(log);  // spawn() appends: a log of an earlier run would come first
  ASSERT_EQ(wait_for(spawn({"--version"}, log)), 0);
  const std::string out = read_all(log);
  EXPECT_EQ(out.substr(0, out.find('\n')), build_description()) << out;
  for (const LibraryVersion& l : library_versions())
    EXPECT_NE(out.find(fmt::format("\n  {:<15} {}", l.name, l.version)), std::string::npos) << l.name << "\n" << out;
}

}  // namespace
}  // namespace rn

// Data-parallel training on GPUs, run here on emulated ones: resnet_sim (the CLI on the CUDA
// emulation, src/backends/cuda/sim) under mpirun, one emulated device per rank, the NCCL
// calls carried over MPI (sim/nccl_sim.cpp). So CI runs the NCCL communicator, the gradient
// buckets all-reduced during backward and joined on the compute stream, synchronised batch
// norm on the device, and sink mode with the all-reduces inside the captured step graph,
// none of which a one-GPU machine can run with more than one rank:
//  - the emulated NCCL's collectives between two ranks, and its refusals (nccl_sim_worker);
//  - 2 ranks of batch 8 with synchronised BN train as 1 rank of batch 16 (fp32);
//  - sink mode over 2 ranks (fp16 O2, the loss scale on the device, several buckets) ends
//    with eager mode's weights, momentum and scaler bit for bit and logs the same losses.
#ifdef RN_HAVE_RESNET_SIM
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "dist_test_util.h"
#include "model/safetensors.h"
#include "train/metrics.h"

namespace rn {
namespace {

using namespace rn::test;

// mpirun -np 2 with the emulation's environment: two devices, the sanitizer's leak check off
// (not these tests' business), the algorithm cache in memory.
std::vector<std::string> mpirun_emulated(int ranks) {
  std::vector<std::string> a = mpirun(ranks);
  for (const char* v : {"RN_SIM_DEVICES", "ASAN_OPTIONS", "RN_CUDNN_ALGO_CACHE"}) {
    a.push_back("-x");
    a.push_back(v);
  }
  return a;
}
const std::vector<std::string> kEnv = {"RN_SIM_DEVICES=2", "ASAN_OPTIONS=detect_leaks=0", "RN_CUDNN_ALGO_CACHE=-"};

RunResult run_worker(const std::string& mode, const fs::path& dir) {
  std::vector<std::string> argv = mpirun_emulated(2);
  argv.push_back(RN_BINARY_DIR "/tests/nccl_sim_worker");
  argv.push_back(mode);
  return run(argv, 300, dir / (mode + ".log"), kEnv);
}

void expect_both_ranks_ok(const RunResult& r) {
  for (int k = 0; k < 2; ++k)
    EXPECT_NE(r.output.find("nccl_sim_worker: rank " + std::to_string(k) + " OK"), std::string::npos) << r.output;
}

TEST(EmulatedGpus, NcclCollectivesBetweenTwoRanksAlsoFromAReplayedGraph) {
  const fs::path dir = fresh_dir("emulated_gpus/collectives");
  const RunResult r = run_worker("collectives", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  expect_both_ranks_ok(r);
}

TEST(EmulatedGpus, CollectivesThatDifferBetweenRanksStopEveryRankNamingBoth) {
  const fs::path dir = fresh_dir("emulated_gpus/mismatch");
  const RunResult r = run_worker("mismatch", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  expect_both_ranks_ok(r);
}

TEST(EmulatedGpus, NcclRefusesOneDeviceTwiceAndAUniqueIdThatWasNotShared) {
  const fs::path dir = fresh_dir("emulated_gpus/refusals");
  for (const char* mode : {"same-device", "own-id"}) {
    const RunResult r = run_worker(mode, dir);
    EXPECT_EQ(r.status, 0) << mode << "\n" << r.output;
    expect_both_ranks_ok(r);
  }
}

// ncclCommInitRank has no timeout of its own: a rank that does not join (or hosts that cannot
// reach each other over NCCL's network) held the others in it for ever. Now rank 0 ends the job
// after dist.timeout_s, with every rank's last heartbeat.
TEST(EmulatedGpus, ARankThatDoesNotJoinNcclEndsTheJobAfterTheTimeout) {
  const fs::path dir = fresh_dir("emulated_gpus/nccl_init");
  std::vector<std::string> argv = mpirun_emulated(2);
  argv.push_back(RN_BINARY_DIR "/tests/nccl_init_worker");
  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run(argv, 300, dir / "out.log", kEnv);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(took, 45) << "not ended by the timeout but by rank 1's return:\n" << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  const size_t at = r.output.find("ncclCommInitRank on rank 0 of 2 has not returned after 3 s");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t status = r.output.find("Status:", at);
  ASSERT_NE(status, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'loading the model'", status), std::string::npos) << r.output;
}

// resnet20 on 16x16 synthetic images, 64 of them: 4 steps of a global batch of 16.
std::vector<std::string> sim_train(const fs::path& out, int per_rank_batch, std::vector<std::string> extra) {
  std::vector<std::string> a = {RN_BINARY_DIR "/resnet_sim", "train"};
  for (const std::string& s :
       {"run.out_dir=" + out.string(), std::string("run.device=cuda"), std::string("model.name=resnet20"),
        std::string("model.in_channels=3"), std::string("model.num_classes=10"), std::string("model.image_size=[16,16]"),
        std::string("data.dataset=synthetic"), std::string("data.train_subset=64"), std::string("data.val_subset=16"),
        "data.batch_size=" + std::to_string(per_rank_batch), std::string("data.workers=1"),
        std::string("data.mean=[0.5,0.5,0.5]"), std::string("data.std=[0.25,0.25,0.25]"),
        std::string("schedule.epochs=1"), std::string("run.threads=1"), std::string("run.log_interval_steps=1"),
        std::string("run.deterministic=true"), std::string("run.checkpoint.keep_best=false"),
        std::string("dist.fusion_threshold=65536")}) {
    a.push_back("--set");
    a.push_back(s);
  }
  for (auto& e : extra) {
    a.push_back("--set");
    a.push_back(e);
  }
  return a;
}

RunResult run_sim(int ranks, const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv = ranks > 1 ? mpirun_emulated(ranks) : std::vector<std::string>{};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, 600, log, kEnv);
}

std::map<int64_t, double> train_losses(const fs::path& run) {
  std::map<int64_t, double> out;
  for (const auto& r : read_metrics((run / "metrics.jsonl").string()))
    if (r.value("kind", "") == "train" && r.contains("loss")) out[r.at("step").get<int64_t>()] = r.at("loss");
  return out;
}

const char* kLastCheckpoint = "checkpoints/step-00000004.safetensors";

TEST(EmulatedGpus, TwoRanksWithSyncBnMatchOneRankWithTwiceTheBatch) {
  const fs::path dir = fresh_dir("emulated_gpus/sync_bn");
  RunResult r = run_sim(2, sim_train(dir / "two", 8, {"precision.level=O0", "dist.sync_bn=true"}), dir / "two.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_sim(1, sim_train(dir / "one", 16, {"precision.level=O0"}), dir / "one.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "two" / "train.log");
  EXPECT_NE(log.find("data-parallel over 2 ranks"), std::string::npos) << log;
  EXPECT_NE(log.find("all-reduced during backward by the nccl communicator"), std::string::npos) << log;
  EXPECT_NE(log.find("batch norm: statistics over the global batch"), std::string::npos) << log;
  const auto one = train_losses(dir / "one"), two = train_losses(dir / "two");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(two.size(), 4u);
  for (const auto& [step, loss] : one) EXPECT_NEAR(two.at(step), loss, 1e-5 * std::fabs(loss)) << "step " << step;
  // The same global batches and BN statistics; the gradients summed in another order.
  const SafetensorsFile a = SafetensorsFile::load((dir / "one" / kLastCheckpoint).string());
  const SafetensorsFile b = SafetensorsFile::load((dir / "two" / kLastCheckpoint).string());
  double num = 0, den = 0;
  size_t compared = 0;
  for (const SafetensorsEntry& e : a.entries()) {
    if (e.dtype_tag != "F32" || e.name.rfind("optimizer.", 0) == 0) continue;
    ASSERT_NE(b.find(e.name), nullptr) << e.name;
    const Tensor x = a.view(e.name), y = b.view(e.name);
    ASSERT_EQ(x.numel(), y.numel()) << e.name;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double d = static_cast<double>(x.ptr<float>()[i]) - y.ptr<float>()[i];
      num += d * d;
      den += static_cast<double>(x.ptr<float>()[i]) * x.ptr<float>()[i];
    }
    ++compared;
  }
  EXPECT_GT(compared, 50u);
  const double rel = std::sqrt(num / den);
  std::printf("emulated GPUs, 2 ranks x 8 with sync BN against 1 x 16: final weights %.2e relative\n", rel);
  EXPECT_LT(rel, 1e-5);
}

TEST(EmulatedGpus, SinkModeWithTheAllReducesInTheGraphEndsAsEagerModeBitForBit) {
  const fs::path dir = fresh_dir("emulated_gpus/sink");
  auto settings = [](const std::string& sink) {
    return std::vector<std::string>{"precision.level=O2", "precision.half_dtype=fp16", "dist.sync_bn=true",
                                    "precision.loss_scale.growth_interval=1", "run.sink_size=" + sink};
  };
  RunResult r = run_sim(2, sim_train(dir / "eager", 8, settings("0")), dir / "eager.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_sim(2, sim_train(dir / "sink", 8, settings("2")), dir / "sink.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "sink" / "train.log");
  EXPECT_NE(log.find("sink mode: the step runs as a CUDA graph with its gradient all-reduces"), std::string::npos)
      << log;
  EXPECT_NE(log.find("loss scale 128 -> 256"), std::string::npos) << "the device's scale, logged\n" << log;
  const auto eager = train_losses(dir / "eager"), sink = train_losses(dir / "sink");
  ASSERT_EQ(eager.size(), 4u);
  EXPECT_EQ(sink, eager);
  const SafetensorsFile a = SafetensorsFile::load((dir / "eager" / kLastCheckpoint).string());
  const SafetensorsFile b = SafetensorsFile::load((dir / "sink" / kLastCheckpoint).string());
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const SafetensorsEntry& e : a.entries()) {
    ASSERT_NE(b.find(e.name), nullptr) << e.name;
    const Tensor x = a.view(e.name), y = b.view(e.name);
    ASSERT_EQ(x.bytes(), y.bytes()) << e.name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes()), 0) << e.name << " differs between eager and sink mode";
  }
}

}  // namespace
}  // namespace rn
#endif

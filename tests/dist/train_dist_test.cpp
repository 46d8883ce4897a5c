// `resnet train` under mpirun on this machine: only rank 0 writes the run; a killed or a
// stopped rank ends the job within the timeout with a message naming it; a 2-rank run
// resumes on 1 rank; the launcher places ranks from a rank table.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_test_util.h"
#include "model/safetensors.h"
#include "nvtx_record.h"
#include "train/device.h"
#include "train/metrics.h"

namespace rn {
namespace {

using namespace rn::test;

// Fashion-MNIST, resnet20, small: 320 training images -> 10 global steps of 32 per epoch.
std::vector<std::string> train_args(const fs::path& out, int per_rank_batch, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {resnet_binary(), "train",
                                "--set", "run.out_dir=" + out.string(),
                                "--set", "data.train_subset=320",
                                "--set", "data.val_subset=200",
                                "--set", "data.batch_size=" + std::to_string(per_rank_batch),
                                "--set", "data.workers=1",
                                "--set", "run.threads=1",
                                "--set", "run.log_interval_steps=1",
                                "--set", "run.deterministic=true",
                                "--set", "schedule.epochs=2",
                                "--set", "schedule.warmup_epochs=0"};
  for (auto& e : extra) {
    a.push_back("--set");
    a.push_back(e);
  }
  return a;
}

std::vector<std::string> under_mpirun(int ranks, std::vector<std::string> args, const std::string& marker = "") {
  std::vector<std::string> a = mpirun(ranks, marker);
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

std::vector<nlohmann::json> records(const fs::path& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& r : read_metrics((run / "metrics.jsonl").string()))
    if (r.value("kind", "") == kind) out.push_back(r);
  return out;
}

TEST(DistTrain, TwoRanksTrainAndOnlyRankZeroWritesTheRun) {
  const fs::path dir = fresh_dir("two_ranks");
  const RunResult r =
      run(under_mpirun(2, train_args(dir / "run", 16, {"dist.fusion_threshold=65536", "run.trace=true"})), 600,
          dir / "out.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("data-parallel over 2 ranks (mpi communicator)"), std::string::npos) << log;
  // `resnet info --params` shows the same buckets the run used.
  const RunResult info = run({resnet_binary(), "info", "--model", "resnet20", "--input", "1x28x28", "--classes", "10",
                              "--params", "--fusion-threshold", "65536"},
                             60, dir / "info.log");
  ASSERT_EQ(info.status, 0) << info.output;
  const size_t at = info.output.find(" gradient buckets at dist.fusion_threshold 65536 bytes");
  ASSERT_NE(at, std::string::npos) << info.output;
  const std::string count = info.output.substr(info.output.rfind('\n', at) + 1, at - info.output.rfind('\n', at) - 1);
  EXPECT_NE(log.find("gradient fusion: " + count + " buckets (dist.fusion_threshold 65536 bytes)"), std::string::npos)
      << count << "\n" << log;
  EXPECT_NE(info.output.find("    0 fc.weight"), std::string::npos) << info.output;
  EXPECT_NE(log.find("peak lr"), std::string::npos);
  // One run folder (rank 1 did not make its own), every step logged once, with the
  // communication figures; per-epoch "comm" records.
  EXPECT_FALSE(fs::exists(dir / "run-2"));
  const auto train = records(dir / "run", "train");
  ASSERT_EQ(train.size(), 20u) << "2 epochs x 10 global steps of 32";
  EXPECT_GT(train[0].value("comm_ms", 0.0), 0.0);
  const auto comm = records(dir / "run", "comm");
  ASSERT_EQ(comm.size(), 2u);
  EXPECT_EQ(comm[0]["ranks"], 2);
  EXPECT_GE(comm[0]["hidden_share"].get<double>(), 0.0);
  EXPECT_LE(comm[0]["hidden_share"].get<double>(), 1.0);
  const auto evals = records(dir / "run", "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_TRUE(fs::exists(dir / "run" / "report.html"));
  // The trace shows each bucket's all-reduce on its own track, inside the step it overlaps.
  const nlohmann::json trace = nlohmann::json::parse(read_all(dir / "run" / "trace.json"));
  int buckets = 0, track = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["args"]["name"] == "gradient all-reduce") track = e["tid"].get<int>();
    if (e.value("cat", "") == "comm") ++buckets;
  }
  EXPECT_GE(track, 1000);
  EXPECT_EQ(buckets % 20, 0) << "the same number of buckets in each of the 20 steps";
  EXPECT_GE(buckets, 40);
  EXPECT_NE(r.output.find("final: top-1"), std::string::npos) << "rank 0 prints the result";
  EXPECT_EQ(r.output.find("final: top-1"), r.output.rfind("final: top-1")) << "only rank 0 prints it";
}

// The final checkpoint's parameters, by name.
std::map<std::string, std::vector<float>> final_weights(const fs::path& run) {
  std::map<std::string, std::vector<float>> out;
  fs::path last;
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path() > last) last = e.path();
  const SafetensorsFile f = SafetensorsFile::load(last.string());
  for (const SafetensorsEntry& e : f.entries()) {
    if (e.name.rfind("optimizer.", 0) == 0 || e.dtype != DType::f32) continue;
    const Tensor t = f.view(e.name);
    out[e.name].assign(t.ptr<float>(), t.ptr<float>() + t.shape.numel());
  }
  return out;
}

// The test the issue asks for: 2 ranks with batch B and synchronised BN train step by step
// like 1 rank with batch 2B (the same global batches, the same BN statistics, averaged
// gradients). On the reference backend (fp64 accumulation) the two differ only in the order
// of fp32 roundings, 1e-7 relative. Training amplifies such differences where a ReLU input
// sits within rounding of zero: at the default learning rate they grew to 5e-4 by step 5,
// so the test trains at a tenth of it (base_lr 0.02), where the measured difference stays
// at 1e-7 for all 10 steps; stated tolerance 1e-5 per step and in the final weights.
// Per-rank BN differs by about 1e-2 (checked too). (With oneDNN the single-rank run uses
// oneDNN's batch norm and other convolution blocking for batch 32, a few 1e-6 per step.)
// Under a profiler each rank's communication thread is named and every collective is a
// range on it (tests/cli/nvtx_recorder records what Nsight Systems would see; "%p" gives
// each rank its own file).
TEST(DistTrain, EachCollectiveIsAnNvtxRangeOnTheNamedCommunicationThread) {
#ifndef RN_NVTX_RECORDER
  GTEST_SKIP() << "built without the NVTX headers (RN_NVTX off or no CUDA toolkit): no ranges to record";
#else
  const fs::path dir = fresh_dir("nvtx_ranks");
  std::vector<std::string> argv = mpirun(2);
  for (const char* v : {"NVTX_INJECTION64_PATH", "RN_NVTX_RECORD"}) {
    argv.push_back("-x");
    argv.push_back(v);
  }
  const std::vector<std::string> args = train_args(dir / "run", 16, {"schedule.epochs=1"});
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run(
      argv, 300, dir / "out.log",
      {std::string("NVTX_INJECTION64_PATH=") + RN_NVTX_RECORDER, "RN_NVTX_RECORD=" + (dir / "nvtx.%p.txt").string()});
  ASSERT_EQ(r.status, 0) << r.output;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.path().filename().string().starts_with("nvtx.")) continue;
    ++files;
    const NvtxRecord rec = parse_nvtx_record(read_all(e.path()));
    for (const std::string& err : rec.errors) ADD_FAILURE() << e.path() << ": " << err;
    int comm = 0;
    for (const auto& [tid, name] : rec.thread_names)
      if (name == "MPI communication") comm = tid;
    ASSERT_NE(comm, 0) << e.path() << ": no thread named \"MPI communication\"";
    ASSERT_TRUE(rec.pushed_on.count(comm)) << e.path();
    int buckets = 0;
    for (const std::string& range : rec.pushed_on.at(comm))
      buckets += range.starts_with("all-reduce of gradient bucket ");
    EXPECT_GE(buckets, 10) << e.path() << ": 10 steps, each at least one gradient bucket";
    EXPECT_GE(rec.pushed.count("bwd_weights conv1"), 10u) << e.path();
  }
  EXPECT_EQ(files, 2) << "one record per rank";
#endif
}

TEST(DistTrain, TwoRanksWithSyncBnMatchOneRankWithTwiceTheBatch) {
  const fs::path dir = fresh_dir("sync_bn");
  const std::vector<std::string> ref = {"run.device=ref", "schedule.epochs=1", "optimizer.base_lr=0.02"};
  std::vector<std::string> sync = ref;
  sync.push_back("dist.sync_bn=true");
  RunResult r = run(under_mpirun(2, train_args(dir / "two", 16, sync)), 600, dir / "two.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(train_args(dir / "one", 32, ref), 600, dir / "one.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto two = records(dir / "two", "train"), one = records(dir / "one", "train");
  ASSERT_EQ(two.size(), 10u);
  ASSERT_EQ(one.size(), 10u);
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    const double a = one[i]["loss"].get<double>(), b = two[i]["loss"].get<double>();
    EXPECT_EQ(one[i]["lr"], two[i]["lr"]) << "step " << i + 1 << ": the learning rate follows the global batch";
    worst = std::max(worst, std::fabs(a - b) / std::fabs(a));
    EXPECT_NEAR(b, a, 1e-5 * std::fabs(a)) << "step " << i + 1;
  }
  const auto w1 = final_weights(dir / "one"), w2 = final_weights(dir / "two");
  ASSERT_EQ(w1.size(), w2.size());
  double num = 0, den = 0;
  for (const auto& [name, v] : w1) {
    const auto& u = w2.at(name);
    ASSERT_EQ(u.size(), v.size()) << name;
    for (size_t i = 0; i < v.size(); ++i) {
      num += (u[i] - v[i]) * static_cast<double>(u[i] - v[i]);
      den += static_cast<double>(v[i]) * v[i];
    }
  }
  const double rel = std::sqrt(num / den);
  std::printf("sync BN: worst per-step loss difference %.2e relative, final weights %.2e relative\n", worst, rel);
  EXPECT_LT(rel, 1e-5);
  // Without synchronised BN each rank normalises over its own 16 images: visibly different.
  r = run(under_mpirun(2, train_args(dir / "per_rank", 16, ref)), 600, dir / "per_rank.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto per_rank = records(dir / "per_rank", "train");
  double diff = 0;
  for (size_t i = 0; i < one.size(); ++i)
    diff = std::max(diff, std::fabs(per_rank[i]["loss"].get<double>() - one[i]["loss"].get<double>()));
  EXPECT_GT(diff, 1e-3) << "per-rank BN should not match the single-rank run this closely";
}

// Precision O1 on the cpu backend with synchronised BN, end to end under mpirun: the batch
// norms that write bf16 copies for the convolutions run their synchronised passes (their
// arithmetic is checked bit for bit in CpuBatchNormNhwcMixed). A smoke test: on the cpu
// backend the two trajectories part after the first update whatever the precision (batches
// of 16 and 32 sum in other orders; measured at O0 as well: 3e-3 by step 8), and even the
// first step's loss sits only 2-3x closer than with per-rank statistics (1.4e-4 against
// 3.3e-4 measured), so only the first step is compared, against a gross error (a wrong
// count or a missing rank's sums moves it by 1e-2 or more), and every loss must be finite.
TEST(DistTrain, O1WithSyncBnRunsUnderMpirun) {
  std::string why;
  if (!make_backend_for(DeviceChoice::cpu)->supports_dtype(DType::bf16, &why)) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("sync_bn_o1");
  const std::vector<std::string> o1 = {"run.device=cpu", "schedule.epochs=1", "optimizer.base_lr=0.02",
                                       "precision.level=O1", "precision.half_dtype=bf16"};
  std::vector<std::string> sync = o1;
  sync.push_back("dist.sync_bn=true");
  RunResult r = run(under_mpirun(2, train_args(dir / "two", 16, sync)), 600, dir / "two.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(train_args(dir / "one", 32, o1), 600, dir / "one.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto two = records(dir / "two", "train"), one = records(dir / "one", "train");
  ASSERT_EQ(two.size(), 10u);
  ASSERT_EQ(one.size(), 10u);
  for (size_t i = 0; i < two.size(); ++i) EXPECT_TRUE(std::isfinite(two[i]["loss"].get<double>())) << "step " << i + 1;
  const double a = one[0]["loss"].get<double>(), b = two[0]["loss"].get<double>();
  EXPECT_NEAR(b, a, 1e-3 * std::fabs(a)) << "the first step, before the runs part";
}

// Waits until rank 0 has logged `steps` training records; false past the deadline.
bool wait_for_steps(const fs::path& run, size_t steps, double deadline_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < deadline_s) {
    if (fs::exists(run / "metrics.jsonl")) {
      std::ifstream f(run / "metrics.jsonl");
      std::string line;
      size_t n = 0;
      while (std::getline(f, line)) n += line.find("\"kind\":\"train\"") != std::string::npos;
      if (n >= steps) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(DistTrain, AKilledRankEndsTheJob) {
  const fs::path dir = fresh_dir("killed");
  const std::string marker = "killed-" + std::to_string(getpid());
  const pid_t job = spawn(under_mpirun(2, train_args(dir / "run", 16, {"schedule.epochs=50", "dist.timeout_s=20"}), marker),
                          dir / "out.log");
  ASSERT_TRUE(wait_for_steps(dir / "run", 3, 300)) << read_all(dir / "out.log");
  const pid_t victim = find_rank(marker, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  const RunResult r = wait_for(job, 60, dir / "out.log");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, -1) << "the job did not end within 60 s of a rank's death:\n" << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

TEST(DistTrain, AStoppedRankEndsTheJobWithinTheTimeoutNamingIt) {
  const fs::path dir = fresh_dir("stopped");
  const std::string marker = "stopped-" + std::to_string(getpid());
  const double timeout = 8;
  const pid_t job = spawn(under_mpirun(2, train_args(dir / "run", 16, {"schedule.epochs=50", "dist.timeout_s=8"}), marker),
                          dir / "out.log");
  ASSERT_TRUE(wait_for_steps(dir / "run", 3, 300)) << read_all(dir / "out.log");
  const pid_t victim = find_rank(marker, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGSTOP);  // alive but silent: what a hung machine looks like
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = wait_for(job, 90, dir / "out.log");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.status, -1) << "the job hung after a rank stopped:\n" << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(took, timeout + 30) << r.output;
  EXPECT_GE(took, timeout - 2) << "ended well before the timeout (the last heartbeat may be up to 1 s old):\n" << r.output;
  // Rank 0 speaks first and names rank 1 and what it was last seen doing.
  EXPECT_NE(r.output.find("rank 1 on"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("has sent no heartbeat") != std::string::npos ||
              r.output.find("held up by rank 1") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step "), std::string::npos);
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("rank 1"), std::string::npos) << "the message is in train.log too:\n" << log;
}

// One rank per app context (MPMD), each with its own command line: as when each host reads its
// own copy of a config file.
std::vector<std::string> one_rank_each(const std::vector<std::string>& rank0, const std::vector<std::string>& rank1) {
  std::vector<std::string> a = mpirun(1);
  a.insert(a.end(), rank0.begin(), rank0.end());
  a.insert(a.end(), {":", "-np", "1"});
  a.insert(a.end(), rank1.begin(), rank1.end());
  return a;
}

// Ranks that were given different recipes stop before anything is made, naming the keys. A
// learning rate or a seed of their own trained for the whole run with no word said (replicas
// drifting apart, shards overlapping); a model of its own crashed inside MPI.
TEST(DistTrain, RanksWithDifferentConfigurationsStopBeforeAnyFolderIsMade) {
  const fs::path dir = fresh_dir("mismatch");
  const RunResult r = run(one_rank_each(train_args(dir / "run", 16, {"optimizer.base_lr=0.1", "data.workers=2"}),
                                        train_args(dir / "run", 16, {"optimizer.base_lr=0.5", "model.name=resnet32"})),
                          300, dir / "out.log");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("the ranks do not all run the same configuration (rank 0's value -> the rank's): rank 1: "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("model.name: resnet20 -> resnet32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optimizer.base_lr: 0.1 -> 0.5"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("data.workers: "), std::string::npos) << "a key each rank may set for itself:\n" << r.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << r.output;
}

// An error on a rank other than 0 is in the run's train.log too, marked with the rank: the log
// used to end with an info line and no cause. (Here a data folder that only rank 1 lacks.)
TEST(DistTrain, AnotherRanksErrorIsInTrainLog) {
  const fs::path dir = fresh_dir("rank1_error");
  const RunResult r = run(one_rank_each(train_args(dir / "run", 16),
                                        train_args(dir / "run", 16, {"data.root=" + (dir / "missing").string()})),
                          300, dir / "out.log");
  EXPECT_NE(r.status, 0) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  const size_t at = log.find("[error] [rank 1] ");
  ASSERT_NE(at, std::string::npos) << log << r.output;
  EXPECT_NE(log.find((dir / "missing").string(), at), std::string::npos) << log;
}

// On a resume, rank 0 chooses the checkpoint and every rank reads that file: a rank whose view of
// the folder lacks the newest one (a copy here; a file system's stale cache in life) used to
// resume 4 steps behind with rank 0's weights and train on the wrong samples.
TEST(DistTrain, EveryRankResumesFromTheCheckpointRankZeroChooses) {
  const fs::path dir = fresh_dir("resume_choice");
  const std::vector<std::string> sets = {"run.checkpoint.every_steps=4", "run.checkpoint.keep_last=0",
                                         "schedule.epochs=1"};
  std::vector<std::string> first = train_args(dir / "run", 16, sets);
  first.insert(first.end(), {"--max-steps", "8"});
  RunResult r = run(under_mpirun(2, first), 600, dir / "first.log");
  ASSERT_EQ(r.status, 0) << r.output;
  fs::copy(dir / "run", dir / "stale", fs::copy_options::recursive);
  ASSERT_TRUE(fs::remove(dir / "stale" / "checkpoints" / "step-00000008.safetensors"));
  r = run(one_rank_each({resnet_binary(), "train", "--resume", (dir / "run").string()},
                        {resnet_binary(), "train", "--resume", (dir / "stale").string()}),
          600, dir / "second.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto train = records(dir / "run", "train");
  ASSERT_EQ(train.size(), 10u) << "8 steps, then 2 more from step 8";
  EXPECT_EQ(train.back()["step"], 10);
  r = run(under_mpirun(2, train_args(dir / "straight", 16, sets)), 600, dir / "straight.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto straight = records(dir / "straight", "train");
  ASSERT_EQ(straight.size(), 10u);
  for (size_t i = 8; i < 10; ++i)
    EXPECT_EQ(train[i]["loss"], straight[i]["loss"]) << "step " << i + 1 << ": the samples of another step?";
}

// A rank whose view of the run folder holds another file under the name rank 0 chose (a stale
// cache of a shared file system): the ranks compare the positions they read and stop, naming
// both, where rank 1 used to resume steps behind rank 0 and crash in mismatched collectives.
// Here each rank runs in its own copy of the folder (mpirun -wdir, a relative --resume).
TEST(DistTrain, RanksThatReadTheCheckpointAsDifferentPositionsStop) {
  const fs::path dir = fresh_dir("resume_stale_view");
  fs::create_directories(dir / "a");
  const std::vector<std::string> sets = {"run.checkpoint.every_steps=4", "run.checkpoint.keep_last=0",
                                         "schedule.epochs=1"};
  std::vector<std::string> first = train_args(dir / "a" / "run", 16, sets);
  first.insert(first.end(), {"--max-steps", "8"});
  RunResult r = run(under_mpirun(2, first), 600, dir / "first.log");
  ASSERT_EQ(r.status, 0) << r.output;
  fs::copy(dir / "a", dir / "b", fs::copy_options::recursive);
  const fs::path stale = dir / "b" / "run" / "checkpoints" / "step-00000008.safetensors";
  fs::remove(stale);
  fs::copy_file(dir / "a" / "run" / "checkpoints" / "step-00000004.safetensors", stale);
  r = run(one_rank_each({"-wdir", (dir / "a").string(), resnet_binary(), "train", "--resume", "run"},
                        {"-wdir", (dir / "b").string(), resnet_binary(), "train", "--resume", "run"}),
          600, dir / "second.log");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 read run/checkpoints/step-00000008.safetensors as step 4 (epoch 1, batch 4), and "
                          "rank 0 as step 8 (epoch 1, batch 8)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(records(dir / "a" / "run", "train").size(), 8u) << "no step after the resume";
}

// A rank 0 that did not run for longer than the timeout (stopped here; a paused machine in life)
// finds rank 1 silent for as long: it used to name rank 1, healthy all along, as the rank that
// held up the job, in train.log too. Now it says it was away, and either the job goes on or the
// message names rank 0.
TEST(DistTrain, ARankThatDidNotRunDoesNotBlameTheOthers) {
  const fs::path dir = fresh_dir("paused_root");
  const std::string marker = "paused-" + std::to_string(getpid());
  const pid_t job =
      spawn(under_mpirun(2, train_args(dir / "run", 16, {"schedule.epochs=30", "dist.timeout_s=4"}), marker),
            dir / "out.log");
  ASSERT_TRUE(wait_for_steps(dir / "run", 3, 300)) << read_all(dir / "out.log");
  const pid_t root = find_rank(marker, 0);
  ASSERT_GT(root, 0);
  kill(root, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(6));
  kill(root, SIGCONT);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(-job, SIGINT);  // the run stops at the next step if it is still going
  const RunResult r = wait_for(job, 120, dir / "out.log");
  EXPECT_NE(r.status, -1) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("rank 0: this process did not run for "), std::string::npos) << log;
  EXPECT_EQ(log.find("held up by rank 1"), std::string::npos) << log;
  EXPECT_EQ(r.output.find("has sent no heartbeat"), std::string::npos) << r.output;
}

// A 2-rank run stopped after 7 steps and resumed on 1 rank takes the steps an uninterrupted
// 2-rank run takes (synchronised BN on ref, as above, so that the per-rank batch changes the
// arithmetic only by rounding). Steps 1-7 are the same computation (equal); the first
// resumed step differs by rounding only (measured 1e-7, bound 1e-6); later steps drift as in
// the test above, even at a quarter of its learning rate (measured 3e-5 by step 20, bound
// 1e-4). A wrong sample order or per-rank BN would show as about 1e-2.
TEST(DistTrain, ATwoRankRunResumesOnOneRankWithTheSameGlobalBatch) {
  const fs::path dir = fresh_dir("resume_2_to_1");
  const std::vector<std::string> sets = {"run.device=ref", "schedule.epochs=1", "optimizer.base_lr=0.005",
                                         "dist.sync_bn=true"};
  std::vector<std::string> first = train_args(dir / "run", 8, sets);
  first.insert(first.end(), {"--max-steps", "7"});
  RunResult r = run(under_mpirun(2, first), 600, dir / "first.log");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(records(dir / "run", "train").size(), 7u);
  r = run({resnet_binary(), "train", "--resume", (dir / "run").string()}, 600, dir / "second.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("batch per rank 8 -> 16 keeps the global batch of 16"), std::string::npos) << log;
  r = run(under_mpirun(2, train_args(dir / "straight", 8, sets)), 600, dir / "straight.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto resumed = records(dir / "run", "train"), straight = records(dir / "straight", "train");
  ASSERT_EQ(resumed.size(), 20u) << "20 global steps of 16, 7 of them before the resume";
  ASSERT_EQ(straight.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(resumed[i]["step"], straight[i]["step"]);
    EXPECT_EQ(resumed[i]["lr"], straight[i]["lr"]) << "step " << i + 1;
    const double a = straight[i]["loss"].get<double>();
    const double bound = i < 7 ? 0.0 : i == 7 ? 1e-6 : 1e-4;
    EXPECT_NEAR(resumed[i]["loss"].get<double>(), a, bound * std::fabs(a)) << "step " << i + 1;
  }
  EXPECT_EQ(records(dir / "run", "eval").size(), 1u);
}

// Per-rank BN (dist.sync_bn off) leaves each rank its own running statistics. They are
// averaged before every evaluation and checkpoint, so a run stopped and resumed on the same
// ranks evaluates exactly as an uninterrupted one (without the averaging, rank 1 would
// resume from rank 0's statistics and its share of the evaluation would differ).
TEST(DistTrain, PerRankBnStatisticsAreAveragedSoAResumedRunEvaluatesAsAnUninterruptedOne) {
  const fs::path dir = fresh_dir("bn_average");
  const std::vector<std::string> sets = {"run.checkpoint.every_steps=5"};
  std::vector<std::string> first = train_args(dir / "run", 16, sets);
  first.insert(first.end(), {"--max-steps", "5"});
  RunResult r = run(under_mpirun(2, first), 600, dir / "first.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(under_mpirun(2, {resnet_binary(), "train", "--resume", (dir / "run").string()}), 600, dir / "second.log");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(under_mpirun(2, train_args(dir / "straight", 16, sets)), 600, dir / "straight.log");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(read_all(dir / "straight" / "train.log").find("running statistics averaged over the ranks"),
            std::string::npos);
  const auto resumed = records(dir / "run", "eval"), straight = records(dir / "straight", "eval");
  ASSERT_EQ(resumed.size(), 2u);
  ASSERT_EQ(straight.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const double a = straight[i]["loss"].get<double>();
    EXPECT_NEAR(resumed[i]["loss"].get<double>(), a, 1e-6 * std::fabs(a)) << "evaluation after epoch " << i + 1;
    EXPECT_EQ(resumed[i]["top1"], straight[i]["top1"]) << "evaluation after epoch " << i + 1;
  }
}

TEST(DistTrain, LaunchPlacesRanksAsTheRankTableSays) {
  const fs::path dir = fresh_dir("launch");
  std::ofstream(dir / "table.json") << R"({"interface": "eth9",
    "hosts": [{"name": "a", "address": "10.9.0.1"}, {"name": "b", "address": "10.9.0.2"}],
    "ranks": [{"rank": 0, "host": "a", "device": 0}, {"rank": 1, "host": "a", "device": 1},
              {"rank": 2, "host": "b", "device": 0}]})";
  RunResult r = run({resnet_binary(), "launch", "--rank-table", (dir / "table.json").string(), "--dry-run", "--",
                     "train", "--config", "x.yaml"},
                    60, dir / "out.log");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("mpirun -np 3 --host 10.9.0.1:2,10.9.0.2:1 --map-by slot"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--mca btl_tcp_if_include eth9 --mca oob_tcp_if_include eth9"), std::string::npos);
  EXPECT_NE(r.output.find("RN_RANK_TABLE=" + (dir / "table.json").string()), std::string::npos);
  EXPECT_NE(r.output.find("train --config x.yaml"), std::string::npos);
  // Without `--`, the command's options are not launch's: the error says where they go.
  r = run({resnet_binary(), "launch", "--rank-table", (dir / "table.json").string(), "--dry-run", "train", "--config",
           "x.yaml"},
          60, dir / "no-dashes.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("put the command to run after --"), std::string::npos) << r.output;
  // A rank table whose hosts are not this machine: each rank refuses its place.
  std::ofstream(dir / "elsewhere.json") << R"({"hosts": [{"name": "no-such-host-xyz"}],
    "ranks": [{"rank": 0, "host": "no-such-host-xyz"}, {"rank": 1, "host": "no-such-host-xyz", "device": 1}]})";
  r = run(under_mpirun(2, train_args(dir / "run", 16, {"dist.rank_table=" + (dir / "elsewhere.json").string()})), 120,
          dir / "elsewhere.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1);
  EXPECT_NE(r.output.find("belongs on host 'no-such-host-xyz'"), std::string::npos) << r.output;
  // Rank 0 in its place, rank 1 not: no rank goes on, so no run folder is made (rank 0 made
  // one, with a train.log that did not say why the job ended, before rank 1's abort).
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::ofstream(dir / "half.json") << R"({"hosts": [{"name": ")" << host
                                   << R"("}, {"name": "no-such-host-xyz", "address": "10.9.9.9"}],
    "ranks": [{"rank": 0, "host": ")"
                                   << host
                                   << R"(", "device": 0}, {"rank": 1, "host": "no-such-host-xyz", "device": 0}]})";
  r = run(under_mpirun(2, train_args(dir / "half_run", 16, {"dist.rank_table=" + (dir / "half.json").string()})), 120,
          dir / "half.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1);
  EXPECT_NE(r.output.find("rank 1 belongs on host 'no-such-host-xyz' (10.9.9.9)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "half_run")) << "a run folder was made: " << r.output;
}

}  // namespace
}  // namespace rn

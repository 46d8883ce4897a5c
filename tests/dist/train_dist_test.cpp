// `resnet train` under mpirun on this machine: only rank 0 writes the run; a killed or a
// stopped rank ends the job within the timeout with a message naming it; a 2-rank run
// resumes on 1 rank; the launcher places ranks from a rank table.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_test_util.h"
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
  const RunResult r = run(under_mpirun(2, train_args(dir / "run", 16)), 600, dir / "out.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("data-parallel over 2 ranks (mpi communicator)"), std::string::npos) << log;
  EXPECT_NE(log.find("gradient fusion:"), std::string::npos) << log;
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
  EXPECT_NE(r.output.find("final: top-1"), std::string::npos) << "rank 0 prints the result";
  EXPECT_EQ(r.output.find("final: top-1"), r.output.rfind("final: top-1")) << "only rank 0 prints it";
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

TEST(DistTrain, ATwoRankRunResumesOnOneRankWithTheSameGlobalBatch) {
  const fs::path dir = fresh_dir("resume_2_to_1");
  RunResult r = run(under_mpirun(2, [&] {
                      auto a = train_args(dir / "run", 8);
                      a.push_back("--max-steps");
                      a.push_back("13");
                      return a;
                    }()),
                    600, dir / "first.log");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(records(dir / "run", "train").size(), 13u);
  r = run({resnet_binary(), "train", "--resume", (dir / "run").string()}, 600, dir / "second.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(dir / "run" / "train.log");
  EXPECT_NE(log.find("batch per rank 8 -> 16 keeps the global batch of 16"), std::string::npos) << log;
  const auto train = records(dir / "run", "train");
  ASSERT_EQ(train.size(), 40u) << "2 epochs x 20 global steps of 16, 13 of them before the resume";
  EXPECT_EQ(train.back()["step"], 40);
  EXPECT_EQ(records(dir / "run", "eval").size(), 2u);
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
  // A rank table whose hosts are not this machine: each rank refuses its place.
  std::ofstream(dir / "elsewhere.json") << R"({"hosts": [{"name": "no-such-host-xyz"}],
    "ranks": [{"rank": 0, "host": "no-such-host-xyz"}, {"rank": 1, "host": "no-such-host-xyz", "device": 1}]})";
  r = run(under_mpirun(2, train_args(dir / "run", 16, {"dist.rank_table=" + (dir / "elsewhere.json").string()})), 120,
          dir / "elsewhere.log");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1);
  EXPECT_NE(r.output.find("belongs on host 'no-such-host-xyz'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace rn

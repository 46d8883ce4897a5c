// The MPI communicator under a real mpirun: dist_worker checks every collective against
// sums it computes itself, for many sizes, element types and gradient-bucket splits.
#include <gtest/gtest.h>

#include "dist_test_util.h"

namespace rn {
namespace {

using namespace rn::test;

void run_worker(int ranks, const std::string& mode) {
  const fs::path dir = fresh_dir("worker_" + mode + "_" + std::to_string(ranks));
  std::vector<std::string> argv = mpirun(ranks);
  argv.push_back(RN_BINARY_DIR "/tests/dist_worker");
  argv.push_back(mode);
  const RunResult r = run(argv, 240, dir / "out.log");
  EXPECT_EQ(r.status, 0) << r.output;
  for (int k = 0; k < ranks; ++k)
    EXPECT_NE(r.output.find("rank " + std::to_string(k) + " of " + std::to_string(ranks) + " OK"), std::string::npos)
        << r.output;
}

TEST(Mpi, CollectivesMatchSumsComputedOnOneRank_2Ranks) { run_worker(2, "collectives"); }
TEST(Mpi, CollectivesMatchSumsComputedOnOneRank_3Ranks) { run_worker(3, "collectives"); }
TEST(Mpi, BucketedGradientAveragesMatchForEverySplit) { run_worker(2, "buckets"); }

// A wait that timed out outside MPI (the NCCL communicator's) said only that it timed out,
// naming no rank; abort_job's status adds every rank's last known state from the heartbeats.
TEST(Mpi, AnAbortWithStatusSaysWhereTheOtherRanksAre) {
  const fs::path dir = fresh_dir("worker_abort_status");
  std::vector<std::string> argv = mpirun(2);
  argv.push_back(RN_BINARY_DIR "/tests/dist_worker");
  argv.push_back("abort-with-status");
  const RunResult r = run(argv, 120, dir / "out.log");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
  const size_t at = r.output.find("no completion after 2.5 s; ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t status = r.output.find("Status:", at);
  ASSERT_NE(status, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 on ", status), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 7, 'waiting for a batch'", status), std::string::npos) << r.output;
}

TEST(Mpi, WithoutALauncherTheWorldIsOneProcess) {
  const fs::path dir = fresh_dir("worker_alone");
  const RunResult r = run({RN_BINARY_DIR "/tests/dist_worker", "collectives"}, 120, dir / "out.log");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 1 OK"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace rn

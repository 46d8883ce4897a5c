// The data-parallel device path under a real mpirun, on a test double of a device
// (device_dp_worker: the decision "which communicator, which gradient buffer", 2 ranks of
// batch 4 against 1 rank of batch 8, join instead of wait, overflow agreement).
#include <gtest/gtest.h>

#include "dist_test_util.h"

namespace rn {
namespace {

using namespace rn::test;

TEST(DeviceDataParallel, TwoRanksOfFourFollowOneRankOfEightJoiningTheirBuckets) {
  const fs::path dir = fresh_dir("device_dp");
  std::vector<std::string> argv = mpirun(2);
  argv.push_back(RN_BINARY_DIR "/tests/device_dp_worker");
  const RunResult r = run(argv, 300, dir / "out.log");
  EXPECT_EQ(r.status, 0) << r.output;
  for (int k = 0; k < 2; ++k)
    EXPECT_NE(r.output.find("device_dp_worker: rank " + std::to_string(k) + " OK"), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
}

}  // namespace
}  // namespace rn

// The NCCL communicator compiles and links in CUDA builds; on a machine without a GPU it
// refuses with a clear error. Its collectives run in scripts/gpu-check.sh on a GPU machine.
#include <gtest/gtest.h>

#include "core/check.h"
#include "dist/nccl_communicator.h"

namespace rn {
namespace {

TEST(Nccl, WithoutAGpuOrNcclTheErrorSaysWhy) {
  auto host = make_local_communicator();
  try {
    auto c = make_nccl_communicator(*host, 0, nullptr, 10);
    GTEST_SKIP() << "a GPU is present: the NCCL communicator is exercised by scripts/gpu-check.sh";
  } catch (const Error& e) {
    const std::string m = e.what();
    if (nccl_available())
      EXPECT_NE(m.find("no usable CUDA device"), std::string::npos) << m;
    else
      EXPECT_NE(m.find("this build has no NCCL"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace rn

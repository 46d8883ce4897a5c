// More host threads than cores is said once, at the count asked for.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/thread_pool.h"
#include "log_capture.h"

namespace rn {
namespace {

TEST(HostThreads, MoreThreadsThanCoresIsSaidOnce) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  ASSERT_GT(cores, 0);
  const int before = host_threads();
  LogCapture log;
  set_host_threads(cores);  // as many as there are cores: nothing to say
  set_host_threads(cores + 3);
  set_host_threads(cores + 3);
  set_host_threads(before);
  const std::string warning = fmt::format("{} host threads asked for, but this machine has {} cores", cores + 3, cores);
  EXPECT_EQ(log.count(warning), 1) << log.text();
  EXPECT_EQ(log.count("host threads asked for"), 1) << log.text();
}

}  // namespace
}  // namespace rn

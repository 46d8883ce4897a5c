// More host threads than cores is said once, at the count asked for.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/thread_pool.h"
#include "log_capture.h"

namespace rn {
namespace {

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HostThreads, MoreThreadsThanCoresIsSaidOnce) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  ASSERT_GT(cores, 0);
  const int before = host_threads();
  std::string text;
  {
    LogCapture log;
    set_host_threads(cores);  // as many as there are cores: nothing to say
    set_host_threads(cores + 3);
    set_host_threads(cores + 3);
    text = log.text();
  }
  set_host_threads(before);
  const std::string warning = fmt::format("{} host threads asked for, but this machine has {} cores", cores + 3, cores);
  EXPECT_EQ(count_of(text, warning), 1) << text;
  EXPECT_EQ(count_of(text, "host threads asked for"), 1) << text;
}

}  // namespace
}  // namespace rn

// Seconds all threads of this process have spent runnable but waiting for a core: the
// scheduler's run delay (the second field of /proc/self/task/<tid>/schedstat, in ns). It grows
// when more threads want to run than there are cores: other programs, or too many of ours.
// NaN where the kernel does not say. Threads that ended since an earlier reading take their
// share with them, which only understates a difference.
#pragma once

#include <filesystem>
#include <fstream>
#include <limits>

namespace rn {

inline double cpu_wait_seconds() {
  std::error_code ec;
  double total_ns = 0;
  bool any = false;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) {
    std::ifstream f(it->path() / "schedstat");
    unsigned long long run_ns = 0, wait_ns = 0;
    if (f >> run_ns >> wait_ns) total_ns += static_cast<double>(wait_ns), any = true;
  }
  return any ? 1e-9 * total_ns : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace rn

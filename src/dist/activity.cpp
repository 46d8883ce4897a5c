#include "dist/activity.h"

#include <atomic>
#include <chrono>

#include "core/nvtx.h"

namespace rn {
namespace {

std::atomic<const char*> g_what{"starting"};
std::atomic<int64_t> g_step{-1};
std::atomic<int64_t> g_since_ns{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void set_activity(const char* what, int64_t step) {
  g_step.store(step, std::memory_order_relaxed);
  set_activity(what);
}

void set_activity(const char* what) {
  g_what.store(what, std::memory_order_relaxed);
  g_since_ns.store(now_ns(), std::memory_order_relaxed);
  nvtx::phase(what);
}

Activity current_activity() {
  Activity a;
  a.what = g_what.load(std::memory_order_relaxed);
  a.step = g_step.load(std::memory_order_relaxed);
  const int64_t since = g_since_ns.load(std::memory_order_relaxed);
  a.seconds = since > 0 ? 1e-9 * static_cast<double>(now_ns() - since) : 0.0;
  return a;
}

}  // namespace rn

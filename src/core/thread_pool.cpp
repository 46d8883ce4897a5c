#include "core/thread_pool.h"

#include <omp.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "core/log.h"

namespace rn {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads <= 0) threads = 1;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
void chunk(int64_t n, int parts, int index, int64_t* begin, int64_t* end) {
  int64_t base = n / parts, rem = n % parts;
  *begin = index * base + (index < rem ? index : rem);
  *end = *begin + base + (index < rem ? 1 : 0);
}
}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    int64_t b, e;
    chunk(n, size(), 0, &b, &e);
    if (b < e) fn(b, e);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    std::exception_ptr err;
    try {
      int64_t b, e;
      chunk(n, size(), index, &b, &e);
      if (b < e) (*job)(b, e);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

namespace {
std::atomic<int> g_requested_threads{0};
std::atomic<bool> g_global_created{false};
}  // namespace

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    g_global_created = true;
    if (g_requested_threads > 0) return g_requested_threads.load();
    // $RN_NUM_THREADS: the pool's size where nothing set it (tests, tools); 1 to 4096 (as
    // run.threads), anything else is said and ignored (atoi took junk as 0, "all cores", and
    // 100000 started that many threads).
    const char* env = std::getenv("RN_NUM_THREADS");
    if (env == nullptr || *env == '\0') return 0;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(env, &end, 10);
    if (errno == 0 && *end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
    RN_LOG_WARN("RN_NUM_THREADS='{}' is not a thread count from 1 to 4096: ignored (all cores)", env);
    return 0;
  }());
  return pool;
}

void set_host_threads(int n) {
  if (n <= 0) return;
  // More threads than cores only makes them take turns; every kernel waits for its slowest
  // thread, so the step slows down. Said once per count asked for.
  static std::atomic<int> warned_for{0};
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0 && n > cores && warned_for.exchange(n) != n)
    RN_LOG_WARN(
        "{} host threads asked for, but this machine has {} cores: the extra threads take turns with the "
        "others and slow every kernel down (0 uses all cores)",
        n, cores);
  if (g_global_created && ThreadPool::global().size() != n)
    RN_LOG_WARN("host thread count set to {} after the pool started with {}", n, ThreadPool::global().size());
  g_requested_threads = n;
  omp_set_num_threads(n);
}

int host_threads() { return ThreadPool::global().size(); }

}  // namespace rn

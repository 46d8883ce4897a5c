// A fixed pool of worker threads with a blocking parallel_for. The calling thread
// takes part, so a pool of size 1 runs everything inline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rn {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into contiguous chunks and calls fn(begin, end) on each; returns when
  // all are done. The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool used by host kernels (size from set_host_threads(), else
  // RN_NUM_THREADS, else the number of cores).
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Sets the host thread count for the project's pool and for oneDNN (OpenMP). Call it
// before the first use of ThreadPool::global(); n <= 0 keeps the defaults.
void set_host_threads(int n);
int host_threads();

}  // namespace rn

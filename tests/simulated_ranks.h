// W simulated data-parallel ranks in one process, for synchronised batch norm tests: each
// rank runs fn(rank, reducer) in its own std::thread, and reducer.sum() is an all-reduce
// among them (barrier, element-wise sum in rank order, barrier), so every rank gets the
// same bits.
//
// The ranks take turns: a rank holds a shared lock while it computes and lets go of it only
// inside sum(). The host kernels share one process-wide ThreadPool, which runs one
// parallel_for at a time, and the turns keep them from calling it at once.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ops/batch_norm.h"

namespace rn::testing {

// ||got - want|| / ||want|| over whole tensors (the bound every comparison here states).
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += std::pow(static_cast<double>(got[i]) - want[i], 2);
    den += std::pow(static_cast<double>(want[i]), 2);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class SimulatedRanks {
 public:
  explicit SimulatedRanks(int ranks)
      : ranks_(ranks), slots_(static_cast<size_t>(ranks)), calls_(static_cast<size_t>(ranks), 0), barrier_(ranks) {}

  int ranks() const { return ranks_; }
  // How often each rank called sum() in the last run() (the same for all, or the test fails).
  int64_t calls_per_rank() const { return calls_[0]; }

  // Runs fn(rank, reducer) on every rank and waits for all; rethrows a rank's exception.
  void run(const std::function<void(int, BatchStatsReducer&)>& fn) {
    calls_.assign(static_cast<size_t>(ranks_), 0);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks_));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks_; ++r) {
      threads.emplace_back([this, r, &fn, &errors] {
        Reducer reducer(*this, r);
        std::unique_lock<std::mutex> turn(turn_);
        reducer.turn = &turn;
        try {
          fn(r, reducer);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
          barrier_.arrive_and_drop();  // the others must not wait for this rank's sum()s
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (int r = 1; r < ranks_; ++r)
      if (calls_[static_cast<size_t>(r)] != calls_[0])
        throw std::runtime_error("ranks called sum() " + std::to_string(calls_[0]) + " and " +
                                 std::to_string(calls_[static_cast<size_t>(r)]) + " times");
  }

 private:
  struct Reducer final : BatchStatsReducer {
    Reducer(SimulatedRanks& o, int r) : owner(o), rank(r) {}
    void sum(double* values, int64_t n) override {
      SimulatedRanks& o = owner;
      ++o.calls_[static_cast<size_t>(rank)];
      o.slots_[static_cast<size_t>(rank)].assign(values, values + n);
      turn->unlock();
      o.barrier_.arrive_and_wait();  // every rank's values are in its slot
      for (int64_t i = 0; i < n; ++i) {
        double s = 0.0;
        for (const auto& slot : o.slots_) s += slot.at(static_cast<size_t>(i));
        values[i] = s;
      }
      o.barrier_.arrive_and_wait();  // every rank has read every slot
      turn->lock();
    }
    SimulatedRanks& owner;
    int rank;
    std::unique_lock<std::mutex>* turn = nullptr;
  };

  int ranks_;
  std::vector<std::vector<double>> slots_;
  std::vector<int64_t> calls_;
  std::barrier<> barrier_;
  std::mutex turn_;
};

}  // namespace rn::testing

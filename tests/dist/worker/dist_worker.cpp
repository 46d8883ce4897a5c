// Run under mpirun by tests/dist/mpi_test.cpp: every rank checks the MPI communicator's
// collectives against values it computes itself (what the sum over all ranks must be),
// for many sizes, element types, reduce ops and gradient-bucket splits. Prints one line
// per failure and "dist_worker: rank R OK (N checks)" at the end; exits non-zero on failure.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/activity.h"
#include "dist/grad_buckets.h"
#include "dist/mpi_communicator.h"
#include "dist/world.h"

namespace {

int failures = 0, checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "dist_worker: FAILED: %s\n", what.c_str());
  }
}

// Rank r's element i: exactly representable, so sums over ranks are exact in any order.
double value(int rank, int64_t i) { return static_cast<double>((i * 7 + rank * 13) % 97) - 48.0 + 0.25 * rank; }

template <class T>
void check_all_reduce(rn::Communicator& c, int64_t n, rn::ReduceOp op) {
  std::vector<T> data(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) data[static_cast<size_t>(i)] = static_cast<T>(value(c.rank(), i));
  c.all_reduce(data.data(), n, op, "test data");
  bool ok = true;
  for (int64_t i = 0; i < n && ok; ++i) {
    double sum = 0;
    for (int r = 0; r < c.size(); ++r) sum += static_cast<double>(static_cast<T>(value(r, i)));
    double want = op == rn::ReduceOp::average ? sum / c.size() : sum;
    if constexpr (std::is_integral_v<T>) want = op == rn::ReduceOp::average ? static_cast<double>(static_cast<T>(sum) / c.size()) : sum;
    const double got = static_cast<double>(data[static_cast<size_t>(i)]);
    if (std::fabs(got - want) > 1e-6 * std::max(1.0, std::fabs(want))) {
      ok = false;
      expect(false, "all-reduce " + std::string(rn::elem_name(rn::elem_type_of<T>())) + " n=" + std::to_string(n) +
                        " element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
                        std::to_string(want));
    }
  }
  if (ok) expect(true, "");
}

void check_buckets(rn::Communicator& c, int64_t threshold, const std::vector<int>& boundaries) {
  // A model-like table: tensors of mixed sizes with 16-element alignment padding.
  const std::vector<int64_t> sizes = {10, 2048, 64, 64, 9 * 64 * 64, 64, 64, 1, 300000, 7, 4096, 5};
  std::vector<rn::GradRange> ranges;
  int64_t off = 0;
  for (int64_t s : sizes) {
    ranges.push_back({off, s});
    off += (s + 15) / 16 * 16;
  }
  std::vector<float> grads(static_cast<size_t>(off), 0.0f);
  for (size_t p = 0; p < ranges.size(); ++p)
    for (int64_t i = 0; i < ranges[p].numel; ++i)
      grads[static_cast<size_t>(ranges[p].offset + i)] = static_cast<float>(value(c.rank(), ranges[p].offset + i));
  rn::GradientReducer red(c, rn::make_grad_buckets(ranges, threshold, boundaries), grads.data(),
                          static_cast<int>(ranges.size()));
  red.begin_step();
  // Backward hands parameters over one or two at a time, in order.
  for (size_t p = 0; p < ranges.size(); p += 2) {
    std::vector<int> ready = {static_cast<int>(p)};
    if (p + 1 < ranges.size()) ready.push_back(static_cast<int>(p + 1));
    red.on_ready(ready);
  }
  const rn::CommStats s = red.finish();
  expect(s.buckets == static_cast<int>(red.buckets().size()) && s.total >= 0 && s.hidden >= 0 && s.exposed >= 0,
         "bucket stats");
  bool ok = true;
  for (size_t p = 0; p < ranges.size() && ok; ++p) {
    for (int64_t i = 0; i < ranges[p].numel; ++i) {
      double sum = 0;
      for (int r = 0; r < c.size(); ++r) sum += static_cast<float>(value(r, ranges[p].offset + i));
      const double want = static_cast<float>(sum) / static_cast<float>(c.size());
      const double got = grads[static_cast<size_t>(ranges[p].offset + i)];
      if (std::fabs(got - want) > 1e-5 * std::max(1.0, std::fabs(want))) {
        ok = false;
        expect(false, "bucketed average, threshold " + std::to_string(threshold) + ", parameter " +
                          std::to_string(p) + " element " + std::to_string(i) + ": got " + std::to_string(got) +
                          ", want " + std::to_string(want));
        break;
      }
    }
  }
  if (ok) expect(true, "");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    rn::World& w = rn::init_world({30, ""});
    rn::Communicator& c = *w.comm;
    const std::string mode = argc > 1 ? argv[1] : "collectives";
    if (mode == "collectives") {
      for (int64_t n : {0, 1, 2, 3, 17, 1000, 65536, 1000003}) {
        check_all_reduce<float>(c, n, rn::ReduceOp::sum);
        check_all_reduce<float>(c, n, rn::ReduceOp::average);
        check_all_reduce<double>(c, n, rn::ReduceOp::sum);
        check_all_reduce<int32_t>(c, n, rn::ReduceOp::sum);
        check_all_reduce<int64_t>(c, n, rn::ReduceOp::average);
      }
      // Many in flight at once, waited for in order.
      std::vector<std::vector<float>> bufs(8, std::vector<float>(5000));
      std::vector<rn::Communicator::Ticket> t;
      for (size_t b = 0; b < bufs.size(); ++b) {
        for (size_t i = 0; i < bufs[b].size(); ++i) bufs[b][i] = static_cast<float>(value(c.rank(), static_cast<int64_t>(i + b)));
        t.push_back(c.all_reduce_async(bufs[b].data(), 5000, rn::ElemType::f32, rn::ReduceOp::sum, "async"));
      }
      for (size_t b = 0; b < bufs.size(); ++b) {
        c.wait(t[b]);
        double sum = 0;
        for (int r = 0; r < c.size(); ++r) sum += static_cast<float>(value(r, static_cast<int64_t>(4999 + b)));
        expect(bufs[b][4999] == static_cast<float>(sum), "async all-reduce " + std::to_string(b));
      }
      std::vector<char> blob(100000);
      for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(c.rank() == 1 ? i * 3 : 0);
      c.broadcast(blob.data(), static_cast<int64_t>(blob.size()), c.size() > 1 ? 1 : 0, "blob");
      bool same = true;
      for (size_t i = 0; i < blob.size(); ++i) same = same && blob[i] == static_cast<char>(c.size() > 1 ? i * 3 : 0);
      expect(same, "broadcast from rank 1");
      expect(c.broadcast_string(c.rank() == 0 ? "run-folder-7" : "", 0) == "run-folder-7", "broadcast_string");
      const std::vector<double> g = c.all_gather(10.0 * c.rank() + 1);
      bool gathered = static_cast<int>(g.size()) == c.size();
      for (int r = 0; r < c.size() && gathered; ++r) gathered = g[static_cast<size_t>(r)] == 10.0 * r + 1;
      expect(gathered, "all_gather");
      c.barrier();
    } else if (mode == "buckets") {
      for (int64_t threshold : {int64_t{1}, int64_t{256}, int64_t{64} << 10, int64_t{1} << 20, int64_t{64} << 20})
        check_buckets(c, threshold, {});
      check_buckets(c, 1, {3, 8});
      check_buckets(c, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    } else if (mode == "abort-with-status") {
      // Rank 1 is elsewhere (its main thread waiting for a batch, its heartbeats going on) while
      // rank 0 gives up on a wait outside MPI, as the NCCL communicator's timeout does: rank 0's
      // message must carry where rank 1 is. The job ends in MPI_Abort.
      rn::set_activity(c.rank() == 1 ? "waiting for a batch" : "backward", 7);
      std::this_thread::sleep_for(std::chrono::milliseconds(c.rank() == 0 ? 2500 : 60000));
      if (c.rank() == 0) rn::abort_job("NCCL all-reduce of bucket 0 on rank 0: no completion after 2.5 s", 1, true);
      expect(false, "rank " + std::to_string(c.rank()) + " was not ended by rank 0's abort");
    } else {
      std::fprintf(stderr, "dist_worker: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    const int rank = w.rank;
    const int world = w.size;
    rn::shutdown_world();
    if (failures == 0) std::printf("dist_worker: rank %d of %d OK (%d checks)\n", rank, world, checks);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_worker: error: %s\n", e.what());
    return 1;
  }
}

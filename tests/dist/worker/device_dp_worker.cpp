// Run under mpirun -np 2 by tests/dist/device_dp_test.cpp: the data-parallel device path of
// `resnet train` on a test double of a device (tests/fake_device.h, the reference backend's
// kernels on memory tagged as device memory, the host fused step), with the MPI
// communicator standing in for NCCL (its "device" buffers are host memory):
//  * make_gradient_sync picks the device communicator (the factory gets this rank's device
//    and the backend's stream) and reduces the device gradients; on a host backend it keeps
//    the host communicator;
//  * 2 ranks x batch 4 with synchronised BN train step by step like 1 rank x batch 8 (the
//    reference backend, host optimizer), at lr 0.02 as tests/dist's equivalence test, eager
//    and in sink mode (the all-reduces inside the replayed step);
//  * every step joins its buckets and waits only in wait_for_gradients();
//  * an inf or a NaN in one rank's gradients is non-finite on every rank after the average,
//    so every rank's overflow check skips the step.
// Prints "device_dp_worker: rank R OK (...)" and exits 0, or prints each failure and exits 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/world.h"
#include "fake_device.h"
#include "model/zoo.h"
#include "train/data_parallel.h"
#include "train/train_step.h"

namespace rn {
namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "device_dp_worker: FAILED: %s\n", what.c_str());
}

// Counts the synchronised-BN sums of the trainer's reducer.
class CountingStatsReducer final : public BatchStatsReducer {
 public:
  explicit CountingStatsReducer(std::unique_ptr<BatchStatsReducer> inner) : inner_(std::move(inner)) {}
  void sum(double* values, int64_t n) override {
    ++calls;
    inner_->sum(values, n);
  }
  bool on_device() const override { return inner_->on_device(); }
  int calls = 0;

 private:
  std::unique_ptr<BatchStatsReducer> inner_;
};

constexpr int kGlobalBatch = 8, kSteps = 6;
constexpr double kLr = 0.02;

ModelOptions small_model() {
  ModelOptions o;
  o.in_channels = 3, o.height = o.width = 16, o.num_classes = 10;
  return o;
}

OptimizerConfig optimizer_config() {
  OptimizerConfig oc;
  oc.momentum = 0.9;
  oc.weight_decay = 1e-4;
  return oc;
}

PrecisionPolicy precision() {
  PrecisionPolicy p;
  p.loss_scale.policy = LossScalePolicy::dynamic;
  p.loss_scale.initial = 128;
  p.loss_scale.growth_interval = 2;
  return p;
}

// Global step k's batch: the same on every rank; a rank takes `count` samples from `first`.
void fill_batch(Plan& plan, int k, int first, int count) {
  Rng rng(100 + static_cast<uint64_t>(k));
  const int64_t per_sample = plan.input().numel() / count;
  std::vector<float> x(static_cast<size_t>(per_sample * kGlobalBatch));
  for (float& v : x) v = rng.normal();
  std::vector<int32_t> labels(kGlobalBatch);
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));
  plan.copy_from_host(plan.input(), x.data() + per_sample * first);
  plan.copy_from_host(plan.labels(), labels.data() + first);
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<float> weights;
};

// One process, batch 8, the host path: what the two ranks together must follow.
Trajectory single_rank_reference() {
  auto ref = make_backend("ref");
  Model model(build_model("resnet20", small_model()));
  model.init(5);
  PlanOptions po;
  po.batch = kGlobalBatch;
  po.layout = Layout::nhwc;
  Plan plan(model, ref.get(), po);
  Optimizer opt(optimizer_config(), model.params());
  const PrecisionPolicy policy = precision();
  LossScaler scaler(policy.loss_scale);
  TrainStep step(plan, opt, scaler, policy);
  Trajectory t;
  for (int k = 0; k < kSteps; ++k) {
    fill_batch(plan, k, 0, kGlobalBatch);
    step.run(kLr);
    t.losses.push_back(plan.loss());
  }
  t.weights.assign(model.param_data(), model.param_data() + model.params().total);
  return t;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

void check_host_backend_keeps_the_host_communicator(Communicator& host, int device) {
  auto ref = make_backend("ref");
  Model model(build_model("resnet20", small_model()));
  bool factory_called = false;
  GradientSync s = make_gradient_sync(model, *ref, host, device, DistConfig{},
                                      [&](Communicator&, int, void*, double) -> std::unique_ptr<Communicator> {
                                        factory_called = true;
                                        return nullptr;
                                      });
  expect(!factory_called && !s.on_device() && s.comm == &host && s.reducer != nullptr,
         "a host backend's gradients go through the host communicator");
}

// The device path against the single-rank run, step by step.
// sink_size > 0: sink mode, the step captured once in a graph (a RecordingGraph, whose
// replays run the captured host code again, as a CUDA graph reruns its NCCL kernels) with
// its gradient all-reduces, and the host waits for the replays, not for tickets.
void check_device_data_parallel(Communicator& host, int device, int sink_size) {
  const Trajectory want = single_rank_reference();
  testing::FakeDevice dev("ref");
  Model model(build_model("resnet20", small_model()));
  model.init(5);
  DistConfig dist;
  dist.fusion_threshold = 16 << 10;  // several buckets
  dist.timeout_s = 30;
  int got_device = -1;
  void* got_stream = nullptr;
  testing::CountingCommunicator* counting = nullptr;
  GradientSync sync =
      make_gradient_sync(model, dev, host, device, dist,
                         [&](Communicator& h, int d, void* stream, double) -> std::unique_ptr<Communicator> {
                           got_device = d;
                           got_stream = stream;
                           auto c = std::make_unique<testing::CountingCommunicator>(h);
                           counting = c.get();
                           return c;
                         });
  expect(sync.on_device() && counting != nullptr && sync.comm == counting,
         "a device backend gets the device communicator");
  expect(got_device == device, "the device communicator is made for this rank's device");
  expect(got_stream == dev.native_stream(), "the device communicator orders after the backend's stream");
  if (!counting) return;
  const int buckets = static_cast<int>(sync.reducer->buckets().size());
  expect(buckets > 2, "several gradient buckets");

  // The trainer's choice: on a device, the BN sums go through the device communicator (here
  // the counting stand-in for NCCL) and are joined, not waited for.
  CountingStatsReducer bn(make_bn_stats_reducer(sync, host));
  expect(bn.on_device(), "a device run sums BN statistics through the device communicator");
  PlanOptions po;
  po.batch = kGlobalBatch / host.size();
  po.layout = Layout::nhwc;
  po.bn_sync = &bn;
  Plan plan(model, &dev, po);
  Optimizer opt(optimizer_config(), model.params());
  const PrecisionPolicy policy = precision();
  LossScaler scaler(policy.loss_scale);
  TrainStep step(plan, opt, scaler, policy, sink_size);
  expect(step.on_device(), "the fused device step runs");
  const int replays0 = testing::RecordingGraph::replays, captures0 = testing::RecordingGraph::captures;
  // Sink mode: rank 0's graph goes stale every 2 replays (its workspace "grew"), rank 1's
  // never; rank 1 must capture again with it.
  if (sink_size > 0 && host.rank() == 0) testing::RecordingGraph::stale_after = 2;
  if (sink_size > 0) {
    step.set_lr_source([](int64_t) { return kLr; }, 0);
    bool refused = false;
    try {
      step.set_gradient_reducer(sync.reducer.get());
    } catch (const Error&) {
      refused = true;
    }
    expect(refused, "sink mode refuses a communicator whose all-reduces a graph cannot hold");
    counting->capturable_for_tests = true;
  }
  step.set_gradient_reducer(sync.reducer.get());
  double worst = 0;
  for (int k = 0; k < kSteps; ++k) {
    fill_batch(plan, k, host.rank() * po.batch, static_cast<int>(po.batch));
    const int waits = counting->waits, joins = counting->joins, bn_sums = bn.calls,
              compute_waits = counting->compute_waits, step_captures = testing::RecordingGraph::captures;
    step.run(kLr);
    expect(bn.calls > bn_sums, "step " + std::to_string(k + 1) + " synchronises BN statistics");
    expect(counting->joins - joins == buckets + (bn.calls - bn_sums),
           "step " + std::to_string(k + 1) + " joins every bucket and every BN sum");
    expect(counting->waits == waits, "step " + std::to_string(k + 1) + ": run() waited for a bucket");
    step.wait_for_gradients();
    if (sink_size > 0) {
      // A capture first waits for the collectives queued before it (the eager warm-up's).
      const int captured = testing::RecordingGraph::captures - step_captures;
      expect(counting->waits == waits && counting->compute_waits == compute_waits + 1 + captured,
             "sink mode: step " + std::to_string(k + 1) +
                 ": the host waits for the compute stream (before a capture and at the sync point), not for a "
                 "bucket");
    } else {
      expect(counting->waits == waits + 1, "wait_for_gradients waits once");
    }
    double loss = plan.loss();
    host.all_reduce(&loss, 1, ReduceOp::average, "loss");
    const double rel = std::fabs(loss - want.losses[static_cast<size_t>(k)]) / want.losses[static_cast<size_t>(k)];
    worst = std::max(worst, rel);
    expect(rel < 1e-5, "step " + std::to_string(k + 1) + ": loss " + std::to_string(loss) + " vs one rank's " +
                           std::to_string(want.losses[static_cast<size_t>(k)]));
  }
  step.sync_host_state();
  std::vector<float> w(model.param_data(), model.param_data() + model.params().total);
  const double rel = rel_diff(w, want.weights);
  expect(rel < 1e-5, "final weights differ from one rank's by " + std::to_string(rel) + " relative");
  // Every rank holds the same bits: rank 0's weights, broadcast, equal this rank's.
  std::vector<float> w0 = w;
  host.broadcast(w0.data(), static_cast<int64_t>(w0.size()) * 4, 0, "rank 0's weights");
  expect(std::memcmp(w0.data(), w.data(), w.size() * 4) == 0, "the ranks' weights are identical");
  if (sink_size > 0) {
    testing::RecordingGraph::stale_after = 0;
    expect(testing::RecordingGraph::replays - replays0 == kSteps - 1, "sink mode replays every step after the first");
    const double captures = testing::RecordingGraph::captures - captures0;
    const std::vector<double> all = host.all_gather(captures, "captures");
    expect(captures > 1 && all[0] == all[1],
           "the ranks capture again together (captures " + std::to_string(all[0]) + " and " +
               std::to_string(all[1]) + ")");
  }
  std::printf("device_dp_worker: rank %d%s: %d buckets, worst per-step loss difference %.2e, final weights %.2e\n",
              host.rank(), sink_size > 0 ? " (sink mode)" : "", buckets, worst, rel);
}

// The host-side equivalent of NCCL's average: an inf on rank 1 and a NaN on rank 0 leave
// non-finite values on every rank, so the overflow check agrees.
void check_overflow_reaches_every_rank(Communicator& host) {
  std::vector<GradRange> ranges = {{0, 100}, {128, 100}};
  std::vector<float> grads(228, 0.5f);
  if (host.rank() == 1) grads[7] = std::numeric_limits<float>::infinity();
  if (host.rank() == 0) grads[130] = std::numeric_limits<float>::quiet_NaN();
  testing::CountingCommunicator c(host);
  GradientReducer red(c, make_grad_buckets(ranges, 1), grads.data(), 2);
  red.begin_step();
  red.on_ready({0, 1});
  red.finish_on_device();
  red.wait_joined();
  expect(std::isinf(grads[7]) && std::isnan(grads[130]) && grads[8] == 0.5f, "inf and NaN spread to every rank");
  LossScaler scaler(precision().loss_scale);
  expect(scaler.check_overflow(grads.data(), 100) && scaler.check_overflow(grads.data() + 128, 100),
         "every rank's overflow check sees the overflow");
}

}  // namespace
}  // namespace rn

int main() {
  try {
    rn::World& w = rn::init_world({60, ""});
    rn::Communicator& host = *w.comm;
    if (host.size() != 2) {
      std::fprintf(stderr, "device_dp_worker: run me with 2 ranks, not %d\n", host.size());
      return 2;
    }
    rn::check_host_backend_keeps_the_host_communicator(host, w.device);
    rn::check_device_data_parallel(host, w.device, 0);
    rn::check_device_data_parallel(host, w.device, 3);
    rn::check_overflow_reaches_every_rank(host);
    const int rank = w.rank;
    rn::shutdown_world();
    if (rn::failures == 0) std::printf("device_dp_worker: rank %d OK\n", rank);
    return rn::failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_dp_worker: error: %s\n", e.what());
    return 1;
  }
}

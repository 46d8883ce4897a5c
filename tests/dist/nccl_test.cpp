// The NCCL communicator compiles and links in CUDA builds; on a machine without a GPU it
// refuses with a clear error. On a GPU (scripts/gpu-check.sh runs Nccl.*) a one-rank
// communicator runs its collectives on device buffers: the ordering after the compute
// stream, join() making later compute work wait, and wait() after join().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "dist/grad_buckets.h"
#include "dist/nccl_communicator.h"
#include "fake_device.h"
#include "model/zoo.h"
#include "ops/backend.h"
#include "train/data_parallel.h"
#include "train/train_step.h"

namespace rn {
namespace {

// The cuda backend, or a skip naming why there is none (no GPU here).
#define RN_GPU_OR_SKIP(var, options)                                                      \
  std::unique_ptr<Backend> var;                                                           \
  try {                                                                                   \
    var = make_backend("cuda", options);                                                  \
  } catch (const std::exception& e) {                                                     \
    GTEST_SKIP() << "no GPU: the NCCL collectives are not run here (" << e.what() << ")"; \
  }

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

TEST(Nccl, OneRankCollectivesOnTheGpuOrderWithTheComputeStream) {
  RN_GPU_OR_SKIP(gpu, BackendOptions{});
  auto host = make_local_communicator();
  auto nccl = make_nccl_communicator(*host, 0, gpu->native_stream(), 30);
  ASSERT_EQ(nccl->size(), 1);
  const int64_t n = 3 * 1024 * 1024 + 5;  // several NCCL chunks, and an odd tail
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 1001) - 7.0f;
  MemorySpace& mem = gpu->memory();
  DeviceBuffer a(mem, static_cast<size_t>(n) * 4), b(mem, static_cast<size_t>(n) * 4);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
    mem.zero(b.data(), b.bytes());
    // Queued on the compute stream without waiting: NCCL must order after it.
    mem.copy_to_device_async(a.data(), values.data(), a.bytes());
    const Communicator::Ticket t = nccl->all_reduce_async(a.data(), n, ElemType::f32, op, "test buffer");
    nccl->join(t);
    mem.copy_to_device_async(b.data(), a.data(), b.bytes());  // compute work after the join
    gpu->synchronize();
    std::vector<float> got(static_cast<size_t>(n));
    mem.copy(got.data(), b.data(), b.bytes());
    EXPECT_EQ(got, values) << "one rank: the " << (op == ReduceOp::sum ? "sum" : "average")
                           << " is the input itself, read after the join";
    nccl->wait(t);  // after join: returns, and again
    nccl->wait(t);
  }
  // Device timing: a mark on the compute stream, a collective, its run time and its end
  // relative to the mark from CUDA events, handed out once.
  nccl->mark_compute();
  const Communicator::Ticket timed = nccl->all_reduce_async(a.data(), n, ElemType::f32, ReduceOp::sum, "timed");
  nccl->wait(timed);
  const std::optional<DeviceCollectiveTiming> dt = nccl->device_timing(timed);
  ASSERT_TRUE(dt) << "the collective was not timed";
  EXPECT_GE(dt->run_s, 0.0);
  EXPECT_LT(dt->run_s, 5.0);
  EXPECT_GE(dt->end_after_mark_s, 0.0) << "issued after the mark, so it ends after it";
  EXPECT_GE(dt->end_after_mark_s, dt->run_s - 1e-5) << "it started after the mark";
  EXPECT_FALSE(nccl->device_timing(timed)) << "handed out once";
  int64_t word = 42;
  DeviceBuffer w(mem, sizeof(word));
  mem.copy(w.data(), &word, sizeof(word));
  nccl->broadcast(w.data(), sizeof(word), 0);
  int64_t back = 0;
  mem.copy(&back, w.data(), sizeof(back));
  EXPECT_EQ(back, 42);
}

// Synchronised batch norm through the trainer's device reducer (make_bn_stats_reducer over a
// one-rank NCCL communicator): the per-channel sums are all-reduced in device memory and
// joined on the compute stream. With one rank the global statistics are the rank's own, so
// the results equal the per-rank kernel's up to the two ways of computing the variance.
TEST(Nccl, OneRankSynchronisedBatchNormMatchesPerRankStatistics) {
  RN_GPU_OR_SKIP(gpu, BackendOptions{});
  auto host = make_local_communicator();
  GradientSync gs;
  gs.device_comm = make_nccl_communicator(*host, 0, gpu->native_stream(), 30);
  gs.comm = gs.device_comm.get();
  const std::unique_ptr<BatchStatsReducer> reducer = make_bn_stats_reducer(gs, *host);
  ASSERT_TRUE(reducer->on_device());
  BatchNormDesc d;
  d.batch = 4, d.channels = 64, d.h = d.w = 5, d.fuse = BnFuse::relu, d.dtype = DType::f32, d.layout = Layout::nhwc;
  const int64_t n = d.batch * d.channels * d.h * d.w, C = d.channels;
  MemorySpace& mem = gpu->memory();
  Rng rng(21);
  std::vector<float> x(static_cast<size_t>(n)), dy(x.size()), gamma(static_cast<size_t>(C)), beta(gamma.size());
  for (float& v : x) v = 1.5f + rng.normal();
  for (float& v : dy) v = rng.uniform(-1, 1);
  for (float& v : gamma) v = rng.uniform(0.5f, 1.5f);
  for (float& v : beta) v = rng.uniform(-0.5f, 0.5f);
  auto run = [&](bool sync) {
    auto bn = gpu->make_batch_norm(d);
    if (sync) bn->set_stats_reducer(reducer.get());
    const Shape xs = d.x_shape(), cs = {C};
    std::vector<DeviceBuffer> bufs;
    bufs.reserve(12);
    // A device tensor holding `init` (zeros when empty).
    auto tensor = [&](const Shape& shape, Layout layout, const std::vector<float>& init) {
      bufs.emplace_back(mem, static_cast<size_t>(shape.numel()) * 4);
      std::vector<float> v = init.empty() ? std::vector<float>(static_cast<size_t>(shape.numel()), 0.0f) : init;
      mem.copy(bufs.back().data(), v.data(), v.size() * 4);
      return Tensor{bufs.back().data(), shape, DType::f32, layout, gpu->device()};
    };
    const std::vector<float> none;
    const Tensor tx = tensor(xs, Layout::nhwc, x), tdy = tensor(xs, Layout::nhwc, dy);
    const Tensor ty = tensor(xs, Layout::nhwc, none), tdx = tensor(xs, Layout::nhwc, none);
    const Tensor tg = tensor(cs, Layout::nchw, gamma), tb = tensor(cs, Layout::nchw, beta);
    const Tensor trm = tensor(cs, Layout::nchw, std::vector<float>(static_cast<size_t>(C), 0.1f));
    const Tensor trv = tensor(cs, Layout::nchw, std::vector<float>(static_cast<size_t>(C), 0.9f));
    const Tensor tsm = tensor(cs, Layout::nchw, none), tsi = tensor(cs, Layout::nchw, none);
    const Tensor tdg = tensor(cs, Layout::nchw, none), tdb = tensor(cs, Layout::nchw, none);
    bn->forward_training(ty, tsm, tsi, tx, nullptr, tg, tb, trm, trv);
    if (sync) {
      EXPECT_NO_THROW(bn->forward_recompute(ty, tx, nullptr, tg, tb, tsm, tsi));
    }
    bn->backward(tdx, nullptr, tdg, tdb, tdy, tx, ty, tg, tsm, tsi);
    gpu->synchronize();
    std::vector<std::vector<float>> out;
    for (const Tensor* t : {&ty, &tdx, &tsm, &tsi, &trm, &trv, &tdg, &tdb}) {
      std::vector<float> v(static_cast<size_t>(t->numel()));
      mem.copy(v.data(), t->data, v.size() * 4);
      out.push_back(v);
    }
    return out;
  };
  const auto plain = run(false), synced = run(true);
  const char* names[] = {"y", "dx", "saved_mean", "saved_invstd", "running_mean", "running_var", "dgamma", "dbeta"};
  for (size_t k = 0; k < plain.size(); ++k) {
    double worst = 0;
    for (size_t i = 0; i < plain[k].size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(synced[k][i]) - plain[k][i]) /
                                  std::max(1.0, std::fabs(static_cast<double>(plain[k][i]))));
    EXPECT_LT(worst, 1e-5) << names[k];
  }
}

// resnet20 on 16x16 inputs, batch 8, fp32, a step on the GPU backend; reduce() has a one-rank
// NCCL communicator all-reduce its gradients in buckets of `threshold` bytes.
Model resnet20_16px() {
  ModelOptions o;
  o.in_channels = 3, o.height = o.width = 16, o.num_classes = 10;
  Model model(build_model("resnet20", o));
  model.init(5);
  return model;
}
PlanOptions batch8_nhwc() {
  PlanOptions po;
  po.batch = 8;
  po.layout = Layout::nhwc;
  return po;
}
struct OneRankTraining {
  Model model = resnet20_16px();
  std::unique_ptr<Communicator> local = make_local_communicator();
  Plan plan;
  Optimizer opt;
  PrecisionPolicy policy;
  LossScaler scaler;
  TrainStep step;
  std::unique_ptr<Communicator> nccl;
  std::unique_ptr<GradientReducer> reducer;

  OneRankTraining(Backend& gpu, int sink)
      : plan(model, &gpu, batch8_nhwc()),
        opt(OptimizerConfig{}, model.params()),
        scaler(policy.loss_scale),
        step(plan, opt, scaler, policy, sink) {}
  ~OneRankTraining() { step.set_gradient_reducer(nullptr); }
  void reduce(Backend& gpu, int64_t threshold) {
    nccl = make_nccl_communicator(*local, 0, gpu.native_stream(), 30);
    std::vector<GradRange> ranges;
    for (const ParamView& v : model.params().params) ranges.push_back({v.offset, v.numel});
    reducer = std::make_unique<GradientReducer>(*nccl, make_grad_buckets(ranges, threshold), model.compute_grad_data(),
                                                static_cast<int>(ranges.size()));
    step.set_gradient_reducer(reducer.get());
  }
};

// The device data-parallel step end to end on one GPU: backward issues NCCL bucket averages
// over the device gradients, the update joins them on the compute stream, the host waits
// only in wait_for_gradients(); and in sink mode, with the all-reduces captured in the step
// graph (the first step eager, then a capture and replays). With one rank an average is the
// identity, so the weights must equal those of the same steps without a reducer, bit for bit
// (high_precision: deterministic algorithms, so two runs can agree).
TEST(Nccl, OneRankDeviceReducerLeavesTrainingUnchanged) {
  BackendOptions bo;
  bo.high_precision = true;
  RN_GPU_OR_SKIP(gpu, bo);
  // sink > 0: sink mode, the NCCL all-reduces captured in the step graph and replayed.
  auto train = [&](bool reduce, int sink) {
    OneRankTraining t(*gpu, sink);
    Model& model = t.model;
    Plan& plan = t.plan;
    TrainStep& step = t.step;
    if (sink > 0) step.set_lr_source([](int64_t) { return 0.05; }, 0);
    if (reduce) {
      t.reduce(*gpu, 64 << 10);
      EXPECT_GT(t.reducer->buckets().size(), 3u);
    }
    Rng rng(3);
    std::vector<float> losses;
    for (int k = 0; k < 3; ++k) {
      testing::fill_random_batch(plan, rng, 10);
      step.run(0.05);
      // Sink mode waits only at the end: the capture (step 2) must itself finish the eager
      // warm-up step's collectives, outside the capture.
      if (sink == 0 || k == 2) step.wait_for_gradients();
      losses.push_back(plan.loss());
      if (reduce && sink == 0) {
        // Each step's communication is timed from the communicator's CUDA events.
        const CommStats& c = step.last_comm();
        EXPECT_TRUE(c.timed) << "step " << k;
        EXPECT_EQ(c.buckets, static_cast<int>(t.reducer->buckets().size()));
        EXPECT_GT(c.total, 0.0) << "step " << k;
        EXPECT_LE(c.exposed, c.total);
        EXPECT_NEAR(c.exposed + c.hidden, c.total, 1e-12);
      }
    }
    step.sync_host_state();
    step.set_gradient_reducer(nullptr);
    std::vector<float> w(model.param_data(), model.param_data() + model.params().total);
    w.insert(w.end(), losses.begin(), losses.end());
    return w;
  };
  const std::vector<float> plain = train(false, 0), reduced = train(true, 0), sunk = train(true, 2);
  ASSERT_EQ(plain.size(), reduced.size());
  EXPECT_TRUE(plain == reduced) << "a one-rank NCCL average changed the training";
  ASSERT_EQ(plain.size(), sunk.size());
  EXPECT_TRUE(plain == sunk) << "sink mode with the NCCL all-reduces inside the replayed graph changed the training";
}

// What the device timing says of overlap: a bucket issued when backward has produced its last
// gradient cannot be hidden behind backward (one bucket: all of it exposed), while buckets
// issued during backward are partly or wholly hidden. On a GPU the events time it; in the
// emulation an event takes its time once its stream's work before it is done, as a GPU's
// does (the end-of-backward mark was stamped after the all-reduce that followed it: one
// bucket reported 100% hidden).
TEST(Nccl, OneRankDeviceTimingCountsTheLastBucketAsExposed) {
  RN_GPU_OR_SKIP(gpu, BackendOptions{});
  auto comm_of_step = [&](int64_t threshold) {
    OneRankTraining t(*gpu, 0);
    Plan& plan = t.plan;
    TrainStep& step = t.step;
    t.reduce(*gpu, threshold);
    const GradientReducer& reducer = *t.reducer;
    Rng rng(3);
    CommStats c;
    for (int k = 0; k < 2; ++k) {
      testing::fill_random_batch(plan, rng, 10);
      step.run(0.05);
      step.wait_for_gradients();
      c = step.last_comm();
    }
    step.set_gradient_reducer(nullptr);
    EXPECT_TRUE(c.timed);
    EXPECT_EQ(c.buckets, static_cast<int>(reducer.buckets().size()));
    EXPECT_GT(c.total, 0.0);
    EXPECT_NEAR(c.exposed + c.hidden, c.total, 1e-12);
    return c;
  };
  const CommStats one = comm_of_step(int64_t{1} << 30);
  EXPECT_EQ(one.buckets, 1);
  // Exposed, up to the events' resolution and the jitter between two streams on a GPU.
  EXPECT_LE(one.hidden, 0.25 * one.total + 50e-6) << "one bucket, total " << one.total << " s";
  const CommStats many = comm_of_step(16 << 10);
  EXPECT_GT(many.buckets, 3);
  EXPECT_GT(many.hidden, 0.0) << "buckets issued during backward, none hidden behind it";
  EXPECT_LT(many.exposed, many.total);
}

}  // namespace
}  // namespace rn

// The device training path (Plan on a device MemorySpace, the fused step, sink mode with a
// captured step, sync back to the host objects), run on the CPU through a test double of a
// device backend: the oneDNN kernels on a separate heap tagged as device memory, the host
// reference of the fused step, and a "graph" that records the step and replays it. Eager
// device steps, sink replays and the host optimizer path must give the same bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fake_device.h"
#include "log_capture.h"
#include "model/zoo.h"
#include "train/train_step.h"

namespace rn {
namespace {

using testing::FakeDevice;
using testing::RecordingGraph;

struct RunResult {
  std::vector<float> weights, momentum;
  LossScaler::State scaler;
  std::vector<float> losses;
};

double g_lr_shift = 0.0;  // a different schedule, to show the comparison notices
double lr_at(int64_t step) { return 0.05 - 0.004 * static_cast<double>(step) + g_lr_shift; }

// resnet20 (3x16x16, batch 8) from fixed weights, SGD/LARS with momentum and weight decay,
// a dynamic loss scale that grows during a run, and the training step over them.
struct Rig {
  static Model make_model() {
    ModelOptions o;
    o.in_channels = 3, o.height = o.width = 16, o.num_classes = 10;
    Model m(build_model("resnet20", o));
    m.init(5);
    return m;
  }
  static PlanOptions plan_options() {
    PlanOptions po;
    po.batch = 8;
    po.layout = Layout::nhwc;
    return po;
  }
  static OptimizerConfig optimizer_config(OptimizerKind kind) {
    OptimizerConfig oc;
    oc.name = kind;
    oc.momentum = 0.9;
    oc.nesterov = kind == OptimizerKind::sgd;
    oc.weight_decay = 1e-3;
    return oc;
  }
  static ParamTable params(const Model& m, const OptimizerConfig& oc) {
    ParamTable table = m.params();
    apply_optimizer_param_policy(table, oc);
    return table;
  }
  static PrecisionPolicy precision() {
    PrecisionPolicy p;
    p.loss_scale.policy = LossScalePolicy::dynamic;
    p.loss_scale.initial = 128;
    p.loss_scale.growth_interval = 2;  // the scale changes during the run
    return p;
  }

  Rig(Backend& backend, int sink, OptimizerKind kind)
      : model(make_model()),
        plan(model, &backend, plan_options()),
        opt(optimizer_config(kind), params(model, optimizer_config(kind))),
        policy(precision()),
        scaler(policy.loss_scale),
        step(plan, opt, scaler, policy, sink) {
    if (sink > 0) step.set_lr_source(lr_at, 0);
  }

  Model model;
  Plan plan;
  Optimizer opt;
  PrecisionPolicy policy;
  LossScaler scaler;
  TrainStep step;
};

// `steps` steps from the same weights and batches.
RunResult train(Backend& backend, int sink, OptimizerKind kind, int steps) {
  Rig rig(backend, sink, kind);
  Rng rng(11);
  RunResult r;
  for (int k = 0; k < steps; ++k) {
    testing::fill_random_batch(rig.plan, rng, 10);
    rig.step.run(lr_at(k));
    r.losses.push_back(rig.plan.loss());
  }
  rig.step.sync_host_state();
  r.weights.assign(rig.model.param_data(), rig.model.param_data() + rig.model.params().total);
  r.momentum = rig.opt.state();
  r.scaler = rig.scaler.state();
  return r;
}

void expect_same(const RunResult& a, const RunResult& b, const char* what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  ASSERT_EQ(a.weights.size(), b.weights.size());
  EXPECT_EQ(std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * 4), 0) << what << ": weights";
  EXPECT_EQ(std::memcmp(a.momentum.data(), b.momentum.data(), a.momentum.size() * 4), 0) << what << ": momentum";
  EXPECT_EQ(a.scaler, b.scaler) << what << ": loss scaler (scale " << a.scaler.scale << " vs " << b.scaler.scale << ")";
}

TEST(DeviceStep, EagerAndSinkMatchTheHostOptimizerBitForBit) {
  auto cpu = make_backend("cpu");
  FakeDevice dev;
  const RunResult host = train(*cpu, 0, OptimizerKind::sgd, 7);
  const RunResult eager = train(dev, 0, OptimizerKind::sgd, 7);
  RecordingGraph::replays = 0;
  const RunResult sink = train(dev, 3, OptimizerKind::sgd, 7);
  EXPECT_EQ(RecordingGraph::replays, 6) << "the first step runs eagerly, the rest replay";
  EXPECT_GT(host.scaler.scale, 128) << "the run was meant to grow the loss scale";
  expect_same(host, eager, "host vs device eager");
  expect_same(eager, sink, "device eager vs sink");
  // The comparison is sensitive: a sink run whose third step has another rate differs.
  g_lr_shift = 1e-4;
  const RunResult shifted = train(dev, 3, OptimizerKind::sgd, 7);
  g_lr_shift = 0.0;
  EXPECT_NE(std::memcmp(shifted.weights.data(), sink.weights.data(), sink.weights.size() * 4), 0);
  std::printf("[device-step] %zu weights; a schedule shifted by 1e-4 changes the first weight by %.3g\n",
              sink.weights.size(), static_cast<double>(shifted.weights[0] - sink.weights[0]));
}

// The "loss scale" lines in train.log are the loss-scale history. The device changes the scale
// between the host's reads; each change is still logged once, with its own step, as the host
// path logs it (the 4 doublings of 8 steps at growth interval 2 were one line per read).
std::vector<std::string> scale_lines(const std::string& log) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("loss scale ") != std::string::npos && line.find(" at step ") != std::string::npos)
      lines.push_back(line);
  return lines;
}

TEST(DeviceStep, EveryScaleChangeIsLoggedWithItsStep) {
  auto cpu = make_backend("cpu");
  FakeDevice dev;
  std::vector<std::string> host, eager, sink;
  {
    LogCapture c;
    train(*cpu, 0, OptimizerKind::sgd, 8);
    host = scale_lines(c.text());
  }
  {
    LogCapture c;
    train(dev, 0, OptimizerKind::sgd, 8);  // read once, at the end
    eager = scale_lines(c.text());
  }
  {
    LogCapture c;
    train(dev, 3, OptimizerKind::sgd, 8);
    sink = scale_lines(c.text());
  }
  ASSERT_EQ(host.size(), 4u) << ::testing::PrintToString(host);
  EXPECT_EQ(host.front(), "loss scale 128 -> 256 at step 2 (2 steps without overflow)");
  EXPECT_EQ(host.back(), "loss scale 1024 -> 2048 at step 8 (2 steps without overflow)");
  EXPECT_EQ(eager, host);
  EXPECT_EQ(sink, host);
}

// Sink mode reads the loss only at synchronisations, so each step records its own on the
// device: take_losses() returns those of every step since the last read, in order, at a
// window's end or in its middle, and they are the losses an eager run reads step by step.
TEST(DeviceStep, SinkModeRecordsEveryStepsLossForItsSynchronisations) {
  FakeDevice dev;
  const RunResult eager = train(dev, 0, OptimizerKind::sgd, 8);
  Rig rig(dev, /*sink=*/3, OptimizerKind::sgd);
  Rng rng(11);
  std::vector<float> read;
  std::vector<size_t> sizes;
  for (int k = 0; k < 8; ++k) {
    testing::fill_random_batch(rig.plan, rng, 10);
    rig.step.run(lr_at(k));
    if (k == 2 || k == 4 || k == 7) {  // a window's end, its middle, the last step
      const std::vector<float> l = rig.step.take_losses();
      sizes.push_back(l.size());
      read.insert(read.end(), l.begin(), l.end());
    }
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 2, 3}));
  EXPECT_EQ(read, eager.losses) << "every step's loss, once, in order";
  EXPECT_TRUE(rig.step.take_losses().empty());
}

// A graph that goes stale (the CUDA one does when the shared workspace it captured is
// reallocated by kernels made later) is captured again, and the run is unchanged.
TEST(DeviceStep, AStaleGraphIsCapturedAgain) {
  FakeDevice dev;
  const RunResult eager = train(dev, 0, OptimizerKind::sgd, 7);
  RecordingGraph::replays = RecordingGraph::captures = 0;
  RecordingGraph::stale_after = 2;
  const RunResult sink = train(dev, 3, OptimizerKind::sgd, 7);
  RecordingGraph::stale_after = 0;
  EXPECT_EQ(RecordingGraph::replays, 6);
  EXPECT_EQ(RecordingGraph::captures, 3) << "6 replays, stale after every 2";
  expect_same(eager, sink, "device eager vs sink with re-captures");
}

TEST(DeviceStep, LarsOnTheDeviceFollowsTheHost) {
  auto cpu = make_backend("cpu");
  FakeDevice dev;
  const RunResult host = train(*cpu, 0, OptimizerKind::lars, 4);
  const RunResult eager = train(dev, 0, OptimizerKind::lars, 4);
  // The LARS norms are summed in another order, so the weights agree closely, not bitwise.
  double diff = 0, norm = 0;
  for (size_t i = 0; i < host.weights.size(); ++i) {
    const double d = static_cast<double>(host.weights[i]) - eager.weights[i];
    diff += d * d;
    norm += static_cast<double>(host.weights[i]) * host.weights[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
  EXPECT_EQ(host.scaler, eager.scaler);
}

TEST(DeviceStep, SinkModeIsRefusedOnHostBackends) {
  auto cpu = make_backend("cpu");
  EXPECT_THROW(train(*cpu, 2, OptimizerKind::sgd, 1), Error);
}

}  // namespace
}  // namespace rn

namespace rn {
namespace {

// resnet20 at 16x16 on the fake device with its plan, optimizer, scaler and step, and
// gradient buckets over its device gradients.
struct DeviceSetup {
  FakeDevice dev;
  Model model;
  std::unique_ptr<Plan> plan;
  std::unique_ptr<Optimizer> opt;
  PrecisionPolicy policy;
  LossScaler scaler{policy.loss_scale};
  std::unique_ptr<TrainStep> step;
  DeviceSetup(int64_t batch, int sink) : model(build_model("resnet20", [] {
                                             ModelOptions o;
                                             o.in_channels = 3, o.height = o.width = 16, o.num_classes = 10;
                                             return o;
                                           }())) {
    model.init(5);
    PlanOptions po;
    po.batch = batch;
    po.layout = Layout::nhwc;
    plan = std::make_unique<Plan>(model, &dev, po);
    opt = std::make_unique<Optimizer>(OptimizerConfig{}, model.params());
    step = std::make_unique<TrainStep>(*plan, *opt, scaler, policy, sink);
  }
  std::unique_ptr<GradientReducer> reducer(Communicator& comm, int64_t threshold) {
    std::vector<GradRange> ranges;
    for (const ParamView& v : model.params().params) ranges.push_back({v.offset, v.numel});
    return std::make_unique<GradientReducer>(comm, make_grad_buckets(ranges, threshold), model.compute_grad_data(),
                                             static_cast<int>(ranges.size()));
  }
};

// The device step with a gradient reducer: run() joins every bucket (the update waits on
// the device) and waits for none; wait_for_gradients() is the one host wait, on the last
// bucket. A world of one: the local communicator's collectives are no-ops.
TEST(DeviceStep, DataParallelStepJoinsItsBucketsAndWaitsOnlyWhenAsked) {
  DeviceSetup d(4, 0);
  Plan& plan = *d.plan;
  TrainStep& step = *d.step;
  auto local = make_local_communicator();
  testing::CountingCommunicator comm(*local);
  std::unique_ptr<GradientReducer> r = d.reducer(comm, 16 << 10);
  GradientReducer& reducer = *r;
  const int buckets = static_cast<int>(reducer.buckets().size());
  ASSERT_GT(buckets, 2);
  step.set_gradient_reducer(&reducer);
  std::vector<float> x(static_cast<size_t>(plan.input().numel()), 0.5f);
  std::vector<int32_t> labels = {1, 2, 3, 4};
  plan.copy_from_host(plan.input(), x.data());
  plan.copy_from_host(plan.labels(), labels.data());
  for (int k = 1; k <= 3; ++k) {
    step.run(0.01);
    EXPECT_EQ(comm.issued, k * buckets);
    EXPECT_EQ(comm.joins, k * buckets) << "step " << k << ": every bucket joined";
    EXPECT_EQ(comm.waits, k - 1) << "step " << k << ": run() waited on the host";
    EXPECT_FALSE(step.last_comm().timed);
    EXPECT_EQ(step.last_comm().buckets, buckets);
    step.wait_for_gradients();
    EXPECT_EQ(comm.waits, k) << "one wait, for the last bucket";
    step.wait_for_gradients();
    EXPECT_EQ(comm.waits, k) << "nothing left to wait for";
  }
}

TEST(DeviceStep, SinkModeRefusesAReducerWhoseAllReducesAGraphCannotHold) {
  DeviceSetup d(2, 2);
  TrainStep& step = *d.step;
  auto local = make_local_communicator();
  std::unique_ptr<GradientReducer> r = d.reducer(*local, 1 << 20);
  GradientReducer& reducer = *r;
  try {
    step.set_gradient_reducer(&reducer);
    FAIL() << "sink mode took a gradient reducer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.sink_size=0"), std::string::npos) << e.what();
  }
}

// A capturable communicator (NCCL; here the counting stand-in) is taken in sink mode: the
// all-reduces are part of the captured step. A step captured with one reducer is captured
// again after the reducer changes, since the graph holds the old one's collectives.
TEST(DeviceStep, SinkModeCapturesTheAllReducesAndCapturesAgainForANewReducer) {
  DeviceSetup d(4, 2);
  Plan& plan = *d.plan;
  TrainStep& step = *d.step;
  step.set_lr_source([](int64_t) { return 0.01; }, 0);
  auto local = make_local_communicator();
  testing::CountingCommunicator comm(*local);
  comm.capturable_for_tests = true;
  std::unique_ptr<GradientReducer> r = d.reducer(comm, 16 << 10);
  const int buckets = static_cast<int>(r->buckets().size());
  step.set_gradient_reducer(r.get());
  std::vector<float> x(static_cast<size_t>(plan.input().numel()), 0.5f);
  std::vector<int32_t> labels = {1, 2, 3, 4};
  plan.copy_from_host(plan.input(), x.data());
  plan.copy_from_host(plan.labels(), labels.data());
  RecordingGraph::replays = RecordingGraph::captures = 0;
  for (int k = 0; k < 3; ++k) step.run(0.01);  // eager warm-up, capture, replays
  EXPECT_EQ(RecordingGraph::captures, 1);
  EXPECT_EQ(comm.issued, 3 * buckets) << "every replay runs the captured all-reduces";
  const int waits = comm.waits;
  step.wait_for_gradients();
  EXPECT_GE(comm.compute_waits, 2) << "before the capture and at the wait: the compute stream";
  EXPECT_EQ(comm.waits, waits) << "sink mode waits for the compute stream, not for a bucket";
  std::unique_ptr<GradientReducer> r2 = d.reducer(comm, 8 << 10);
  step.set_gradient_reducer(r2.get());
  step.run(0.01);
  EXPECT_EQ(RecordingGraph::captures, 2) << "a new reducer: the step is captured again";
  step.set_gradient_reducer(nullptr);
  step.run(0.01);
  EXPECT_EQ(RecordingGraph::captures, 3) << "no reducer any more: captured again without the all-reduces";
}

}  // namespace
}  // namespace rn

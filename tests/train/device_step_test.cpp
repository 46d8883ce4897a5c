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
#include <vector>

#include "core/rng.h"
#include "model/zoo.h"
#include "train/train_step.h"

namespace rn {
namespace {

class FakeDeviceMemory final : public MemorySpace {
 public:
  Device device() const override { return Device::cuda; }
  void* allocate(size_t bytes) override { return host_memory().allocate(bytes); }
  void free(void* p) noexcept override { host_memory().free(p); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
};

// The loss honours a scale source in "device" memory, as the CUDA kernel does.
class ScaledLoss final : public SoftmaxCrossEntropyKernel {
 public:
  explicit ScaledLoss(std::unique_ptr<SoftmaxCrossEntropyKernel> k)
      : SoftmaxCrossEntropyKernel(k->desc()), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) override {
    k_->forward(loss, probs, logits, labels);
  }
  void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) override {
    const float s = scale_source() ? *scale_source()->ptr<float>() : 1.0f;
    k_->backward(dlogits, probs, labels, grad_scale * s);
  }

 private:
  std::unique_ptr<SoftmaxCrossEntropyKernel> k_;
};

class RecordingGraph final : public StepGraph {
 public:
  void capture(const std::function<void()>& work) override { work_ = work; }
  bool captured() const override { return static_cast<bool>(work_); }
  void replay() override {
    ++replays;
    work_();
  }
  static inline int replays = 0;

 private:
  std::function<void()> work_;
};

class FakeDevice final : public Backend {
 public:
  std::string name() const override { return "fake-device"; }
  Device device() const override { return Device::cuda; }
  Layout preferred_layout() const override { return Layout::nhwc; }
  bool supports_dtype(DType t, std::string* why) const override { return cpu_->supports_dtype(t, why); }
  MemorySpace& memory() override { return memory_; }
  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override { return cpu_->make_conv2d(d); }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override { return cpu_->make_batch_norm(d); }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override { return cpu_->make_relu(d); }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override { return cpu_->make_add(d); }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override { return cpu_->make_cast(d); }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override { return cpu_->make_max_pool(d); }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return cpu_->make_global_avg_pool(d);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override { return cpu_->make_linear(d); }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return std::make_unique<ScaledLoss>(cpu_->make_softmax_cross_entropy(d));
  }
  std::unique_ptr<FusedStepKernel> make_fused_step(const FusedStepDesc& d) override { return make_host_fused_step(d); }
  std::unique_ptr<StepGraph> make_step_graph() override { return std::make_unique<RecordingGraph>(); }

 private:
  std::unique_ptr<Backend> cpu_ = make_backend("cpu");
  FakeDeviceMemory memory_;
};

struct RunResult {
  std::vector<float> weights, momentum;
  LossScaler::State scaler;
  std::vector<float> losses;
};

double g_lr_shift = 0.0;  // a different schedule, to show the comparison notices
double lr_at(int64_t step) { return 0.05 - 0.004 * static_cast<double>(step) + g_lr_shift; }

// `steps` steps of resnet20 (3x16x16, batch 8) from the same weights and batches.
RunResult train(Backend& backend, int sink, OptimizerKind kind, int steps) {
  ModelOptions o;
  o.in_channels = 3, o.height = o.width = 16, o.num_classes = 10;
  Model model(build_model("resnet20", o));
  model.init(5);
  PlanOptions po;
  po.batch = 8;
  po.layout = Layout::nhwc;
  Plan plan(model, &backend, po);
  OptimizerConfig oc;
  oc.name = kind;
  oc.momentum = 0.9;
  oc.nesterov = kind == OptimizerKind::sgd;
  oc.weight_decay = 1e-3;
  ParamTable table = model.params();
  apply_optimizer_param_policy(table, oc);
  Optimizer opt(oc, table);
  PrecisionPolicy policy;
  policy.loss_scale.policy = LossScalePolicy::dynamic;
  policy.loss_scale.initial = 128;
  policy.loss_scale.growth_interval = 2;  // the scale changes during the run
  LossScaler scaler(policy.loss_scale);
  TrainStep step(plan, opt, scaler, policy, sink);
  if (sink > 0) step.set_lr_source(lr_at, 0);
  Rng rng(11);
  RunResult r;
  for (int k = 0; k < steps; ++k) {
    std::vector<float> x(static_cast<size_t>(plan.input().numel()));
    for (float& v : x) v = rng.normal();
    std::vector<int32_t> labels(8);
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));
    plan.copy_from_host(plan.input(), x.data());
    plan.copy_from_host(plan.labels(), labels.data());
    step.run(lr_at(k));
    r.losses.push_back(plan.loss());
  }
  step.sync_host_state();
  r.weights.assign(model.param_data(), model.param_data() + model.params().total);
  r.momentum = opt.state();
  r.scaler = scaler.state();
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

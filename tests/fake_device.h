// Test doubles for the device training path on a CPU-only machine:
//  * FakeDevice: a device backend whose kernels are a host backend's ("cpu": oneDNN, "ref":
//    plain loops) on a separate heap tagged as device memory, with the host reference of
//    the fused step and a "graph" that records the step and replays it. Its native stream
//    is a sentinel address, so a test can see it handed on; `uploader` may replace its
//    (plain, synchronous) input staging.
//  * CountingCommunicator: forwards to another communicator and counts wait() and join(),
//    the device path's promise being that a step joins its buckets and never waits in run().
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/communicator.h"
#include "model/plan.h"
#include "ops/backend.h"

namespace rn::testing {

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
  void capture(const std::function<void()>& work) override {
    work_ = work;
    ++captures;
    since_capture_ = 0;
  }
  // stale_after > 0: the graph goes stale after that many replays (as a CUDA graph does when
  // the workspace it captured is reallocated), and the caller must capture it again.
  bool captured() const override { return work_ && (stale_after == 0 || since_capture_ < stale_after); }
  void replay() override {
    if (!captured()) throw Error("RecordingGraph: replay of a stale or missing capture");
    ++replays;
    ++since_capture_;
    work_();
  }
  void invalidate() override { work_ = nullptr; }
  static inline int replays = 0, captures = 0, stale_after = 0;

 private:
  std::function<void()> work_;
  int since_capture_ = 0;
};

class FakeDevice final : public Backend {
 public:
  explicit FakeDevice(const std::string& kernels = "cpu") : host_(make_backend(kernels)) {}
  std::string name() const override { return "fake-device"; }
  Device device() const override { return Device::cuda; }
  Layout preferred_layout() const override { return Layout::nhwc; }
  bool supports_dtype(DType t, std::string* why) const override { return host_->supports_dtype(t, why); }
  MemorySpace& memory() override { return memory_; }
  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override { return host_->make_conv2d(d); }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override {
    return host_->make_batch_norm(d);
  }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override { return host_->make_relu(d); }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override { return host_->make_add(d); }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override { return host_->make_cast(d); }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override { return host_->make_max_pool(d); }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return host_->make_global_avg_pool(d);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override { return host_->make_linear(d); }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return std::make_unique<ScaledLoss>(host_->make_softmax_cross_entropy(d));
  }
  std::unique_ptr<FusedStepKernel> make_fused_step(const FusedStepDesc& d) override { return make_host_fused_step(d); }
  std::unique_ptr<StepGraph> make_step_graph() override { return std::make_unique<RecordingGraph>(); }
  void* native_stream() override { return &stream_; }
  std::unique_ptr<Uploader> make_uploader(size_t bytes) override {
    return uploader ? uploader(memory_, bytes) : make_plain_uploader(memory_, bytes);
  }
  // Set to hand out another uploader (one that records its calls, say).
  std::function<std::unique_ptr<Uploader>(MemorySpace&, size_t)> uploader;

 private:
  std::unique_ptr<Backend> host_;
  FakeDeviceMemory memory_;
  int stream_ = 0;
};

class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return "counting " + inner_.name(); }
  std::vector<std::string> hosts() const override { return inner_.hosts(); }
  Ticket all_reduce_async(void* data, int64_t count, ElemType type, ReduceOp op, const std::string& what) override {
    ++issued;
    return inner_.all_reduce_async(data, count, type, op, what);
  }
  CollectiveTiming wait(Ticket t) override {
    ++waits;
    return inner_.wait(t);
  }
  void join(Ticket t) override {
    ++joins;
    inner_.join(t);
  }
  void mark_compute() override { inner_.mark_compute(); }
  // A stand-in for NCCL under a RecordingGraph, whose replays run the captured host code again.
  bool capturable() const override { return capturable_for_tests; }
  void wait_for_compute(const std::string& what) override {
    ++compute_waits;
    inner_.wait_for_compute(what);
  }
  bool capturable_for_tests = false;
  int compute_waits = 0;
  std::optional<DeviceCollectiveTiming> device_timing(Ticket t) override { return inner_.device_timing(t); }
  void broadcast(void* data, int64_t bytes, int root, const std::string& what) override {
    inner_.broadcast(data, bytes, root, what);
  }
  void barrier(const std::string& what) override { inner_.barrier(what); }
  std::vector<double> all_gather(double value, const std::string& what) override {
    return inner_.all_gather(value, what);
  }

  int issued = 0, waits = 0, joins = 0;

 private:
  Communicator& inner_;
};

// Normal pixels and labels uniform in [0, classes) into the plan's input and labels (f32
// input), through copy_from_host so that it works on any backend.
inline void fill_random_batch(Plan& plan, Rng& rng, int classes) {
  std::vector<float> x(static_cast<size_t>(plan.input().numel()));
  for (float& v : x) v = rng.normal();
  std::vector<int32_t> labels(static_cast<size_t>(plan.labels().numel()));
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  plan.copy_from_host(plan.input(), x.data());
  plan.copy_from_host(plan.labels(), labels.data());
}

}  // namespace rn::testing

// Test helper: runs a device backend's kernels on host tensors. Every kernel call copies
// its tensor arguments to device buffers (one per distinct host pointer, so in-place calls
// stay in place), runs the device kernel, waits, and copies every argument back. The
// harness can then treat the device backend like a host one.
#pragma once

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace rn {

// The device copies of one call's arguments.
class Staging {
 public:
  Staging(Backend& device) : device_(device) {}
  Tensor operator()(const Tensor& host) {
    if (host.data == nullptr) return host;
    Tensor t = host;
    auto it = by_host_.find(host.data);
    if (it == by_host_.end()) {
      buffers_.emplace_back(device_.memory(), host.bytes());
      device_.memory().copy(buffers_.back().data(), host.data, host.bytes());
      it = by_host_.emplace(host.data, Entry{buffers_.size() - 1, host.bytes()}).first;
    }
    t.data = buffers_[it->second.index].data();
    t.device = device_.device();
    return t;
  }
  const Tensor* operator()(const Tensor* host, Tensor& keep) {
    if (!host) return nullptr;
    keep = (*this)(*host);
    return &keep;
  }
  // Waits for the device, then copies every argument back to its host tensor. While an
  // exception from the kernel call unwinds, it copies nothing and swallows a second error
  // (throwing then would terminate the test program without naming the failing case).
  ~Staging() noexcept(false) {
    if (std::uncaught_exceptions() > 0) {
      try {
        device_.synchronize();
      } catch (...) {
      }
      return;
    }
    device_.synchronize();
    for (const auto& [host, e] : by_host_) device_.memory().copy(host, buffers_[e.index].data(), e.bytes);
  }

 private:
  struct Entry {
    size_t index, bytes;
  };
  Backend& device_;
  std::vector<DeviceBuffer> buffers_;
  std::map<void*, Entry> by_host_;
};

namespace staged {

// Convolutions and linear layers share the weighted-op signatures.
template <class K>
class Weighted final : public K {
 public:
  Weighted(Backend& b, std::unique_ptr<K> k) : K(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias) override {
    Staging s(b_);
    Tensor kb;
    k_->forward(s(y), s(x), s(w), s(bias, kb));
  }
  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    Staging s(b_);
    k_->backward_data(s(dx), s(dy), s(w));
  }
  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override {
    Staging s(b_);
    Tensor kb;
    k_->backward_weights(s(dw), s(db, kb), s(dy), s(x));
  }

 private:
  Backend& b_;
  std::unique_ptr<K> k_;
};
using Conv = Weighted<Conv2dKernel>;
using Linear = Weighted<LinearKernel>;

class BatchNorm final : public BatchNormKernel {
 public:
  BatchNorm(Backend& b, std::unique_ptr<BatchNormKernel> k) : BatchNormKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward_training(const Tensor& y, const Tensor& sm, const Tensor& si, const Tensor& x, const Tensor* r,
                           const Tensor& g, const Tensor& be, const Tensor& rm, const Tensor& rv) override {
    Staging s(b_);
    Tensor kr;
    k_->forward_training(s(y), s(sm), s(si), s(x), s(r, kr), s(g), s(be), s(rm), s(rv));
  }
  void do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* r, const Tensor& g, const Tensor& be,
                            const Tensor& rm, const Tensor& rv) override {
    Staging s(b_);
    Tensor kr;
    k_->forward_inference(s(y), s(x), s(r, kr), s(g), s(be), s(rm), s(rv));
  }
  void do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* r, const Tensor& g, const Tensor& be,
                            const Tensor& sm, const Tensor& si) override {
    Staging s(b_);
    Tensor kr;
    k_->forward_recompute(s(y), s(x), s(r, kr), s(g), s(be), s(sm), s(si));
  }
  void do_backward(const Tensor& dx, const Tensor* dr, const Tensor& dg, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& y, const Tensor& g, const Tensor& sm, const Tensor& si) override {
    Staging s(b_);
    Tensor kdr;
    k_->backward(s(dx), s(dr, kdr), s(dg), s(db), s(dy), s(x), s(y), s(g), s(sm), s(si));
  }
  // A reducer of host memory (the tests' simulated ranks) reaches the device kernel as a
  // device reducer whose sums cross to the host and back.
  void do_set_stats_reducer(BatchStatsReducer* r) override {
    auto bridge = r ? std::make_unique<HostBridge>(b_, *r) : nullptr;
    k_->set_stats_reducer(bridge.get());
    bridge_ = std::move(bridge);
  }

 private:
  struct HostBridge final : BatchStatsReducer {
    HostBridge(Backend& b, BatchStatsReducer& host) : b(b), host(host) {}
    void sum(double* values, int64_t n) override {
      std::vector<double> h(static_cast<size_t>(n));
      b.memory().copy(h.data(), values, h.size() * sizeof(double));  // after the kernels queued so far
      host.sum(h.data(), n);
      b.memory().copy(values, h.data(), h.size() * sizeof(double));
    }
    bool on_device() const override { return true; }
    Backend& b;
    BatchStatsReducer& host;
  };
  Backend& b_;
  std::unique_ptr<BatchNormKernel> k_;
  std::unique_ptr<HostBridge> bridge_;
};

class Relu final : public ReluKernel {
 public:
  Relu(Backend& b, std::unique_ptr<ReluKernel> k) : ReluKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    Staging s(b_);
    k_->forward(s(y), s(x));
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    Staging s(b_);
    k_->backward(s(dx), s(dy), s(y));
  }

 private:
  Backend& b_;
  std::unique_ptr<ReluKernel> k_;
};

class Add final : public AddKernel {
 public:
  Add(Backend& b, std::unique_ptr<AddKernel> k) : AddKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& a, const Tensor& bb) override {
    Staging s(b_);
    k_->forward(s(y), s(a), s(bb));
  }

 private:
  Backend& b_;
  std::unique_ptr<AddKernel> k_;
};

class Cast final : public CastKernel {
 public:
  Cast(Backend& b, std::unique_ptr<CastKernel> k) : CastKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    Staging s(b_);
    k_->forward(s(y), s(x));
  }

 private:
  Backend& b_;
  std::unique_ptr<CastKernel> k_;
};

class MaxPool final : public MaxPoolKernel {
 public:
  MaxPool(Backend& b, std::unique_ptr<MaxPoolKernel> k) : MaxPoolKernel(k->desc()), b_(b), k_(std::move(k)) {}
  size_t workspace_bytes() const override { return k_->workspace_bytes(); }

 protected:
  void do_forward(const Tensor& y, const Tensor& ws, const Tensor& x) override {
    Staging s(b_);
    k_->forward(s(y), s(ws), s(x));
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& ws) override {
    Staging s(b_);
    k_->backward(s(dx), s(dy), s(ws));
  }

 private:
  Backend& b_;
  std::unique_ptr<MaxPoolKernel> k_;
};

class GlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  GlobalAvgPool(Backend& b, std::unique_ptr<GlobalAvgPoolKernel> k)
      : GlobalAvgPoolKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    Staging s(b_);
    k_->forward(s(y), s(x));
  }
  void do_backward(const Tensor& dx, const Tensor& dy) override {
    Staging s(b_);
    k_->backward(s(dx), s(dy));
  }

 private:
  Backend& b_;
  std::unique_ptr<GlobalAvgPoolKernel> k_;
};

class Loss final : public SoftmaxCrossEntropyKernel {
 public:
  Loss(Backend& b, std::unique_ptr<SoftmaxCrossEntropyKernel> k)
      : SoftmaxCrossEntropyKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) override {
    Staging s(b_);
    k_->forward(s(loss), s(probs), s(logits), s(labels));
  }
  void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) override {
    Staging s(b_);
    k_->backward(s(dlogits), s(probs), s(labels), grad_scale);
  }

 private:
  Backend& b_;
  std::unique_ptr<SoftmaxCrossEntropyKernel> k_;
};

class CropFlipNormalize final : public CropFlipNormalizeKernel {
 public:
  CropFlipNormalize(Backend& b, std::unique_ptr<CropFlipNormalizeKernel> k)
      : CropFlipNormalizeKernel(k->desc()), b_(b), k_(std::move(k)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& crops) override {
    Staging s(b_);
    k_->forward(s(y), s(x), s(crops));
  }

 private:
  Backend& b_;
  std::unique_ptr<CropFlipNormalizeKernel> k_;
};

// The wrapper backend: kernels of `device` that take host tensors.
class StagedBackend final : public Backend {
 public:
  explicit StagedBackend(std::unique_ptr<Backend> device) : d_(std::move(device)) {}
  std::string name() const override { return d_->name(); }
  Device device() const override { return Device::cpu; }  // callers hand it host tensors
  Layout preferred_layout() const override { return d_->preferred_layout(); }
  bool supports_dtype(DType t, std::string* why) const override { return d_->supports_dtype(t, why); }
  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override {
    return std::make_unique<Conv>(*d_, d_->make_conv2d(d));
  }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override {
    return std::make_unique<BatchNorm>(*d_, d_->make_batch_norm(d));
  }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override {
    return std::make_unique<Relu>(*d_, d_->make_relu(d));
  }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override {
    return std::make_unique<Add>(*d_, d_->make_add(d));
  }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override {
    return std::make_unique<Cast>(*d_, d_->make_cast(d));
  }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override {
    return std::make_unique<MaxPool>(*d_, d_->make_max_pool(d));
  }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return std::make_unique<GlobalAvgPool>(*d_, d_->make_global_avg_pool(d));
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override {
    return std::make_unique<Linear>(*d_, d_->make_linear(d));
  }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return std::make_unique<Loss>(*d_, d_->make_softmax_cross_entropy(d));
  }
  std::unique_ptr<CropFlipNormalizeKernel> make_crop_flip_normalize(const CropFlipNormalizeDesc& d) override {
    return std::make_unique<CropFlipNormalize>(*d_, d_->make_crop_flip_normalize(d));
  }
  void synchronize() override { d_->synchronize(); }

 private:
  std::unique_ptr<Backend> d_;
};

}  // namespace staged

inline std::unique_ptr<Backend> make_staged_backend(std::unique_ptr<Backend> device) {
  return std::make_unique<staged::StagedBackend>(std::move(device));
}

// Whether the cuda backend is built and starts (a GPU is present); otherwise *why says why,
// for the skip message.
inline bool cuda_usable(std::string* why) {
  static const std::string reason = [] {
    const auto names = available_backends();
    if (std::find(names.begin(), names.end(), "cuda") == names.end())
      return std::string("this build has no CUDA backend (configure found no nvcc/cuDNN)");
    try {
      make_backend("cuda");
      return std::string();
    } catch (const std::exception& e) {
      return std::string("no usable GPU: ") + e.what();
    }
  }();
  if (why) *why = reason;
  return reason.empty();
}

}  // namespace rn

// The reference backend object: a thin table that forwards each factory to its op
// family's file (ref_conv2d.cpp, ref_batch_norm.cpp, ...).
#include "backends/ref/ref_backend.h"

#include "backends/ref/ref_kernels.h"

namespace rn {
namespace {

class RefBackend final : public Backend {
 public:
  std::string name() const override { return "ref"; }
  std::string describe() const override { return "ref (scalar reference kernels; no implementation modes)"; }
  Device device() const override { return Device::cpu; }
  Layout preferred_layout() const override { return Layout::nchw; }

  bool supports_dtype(DType dtype, std::string* why_not) const override {
    if (dtype == DType::f32) return true;
    if (why_not) {
      *why_not = "the ref backend computes only fp32 (asked for " + std::string(dtype_name(dtype)) +
                 "); tests run it on values already rounded to the half type";
    }
    return false;
  }

  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override { return ref::make_conv2d(d); }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override { return ref::make_batch_norm(d); }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override { return ref::make_relu(d); }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override { return ref::make_add(d); }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override { return ref::make_cast(d); }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override { return ref::make_max_pool(d); }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return ref::make_global_avg_pool(d);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override { return ref::make_linear(d); }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return ref::make_softmax_cross_entropy(d);
  }
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

}  // namespace rn

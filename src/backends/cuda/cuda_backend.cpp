// The CUDA backend object: the shared Context and the kernel factories.
#include "backends/cuda/cuda_backend.h"

#include "backends/cuda/context.h"
#include "backends/cuda/fused_step.h"

namespace rn {
namespace cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o) : ctx_(std::make_shared<Context>(o)) {}
  ~CudaBackend() override {
    try {
      ctx_->synchronize();
    } catch (...) {
    }
  }
  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  Layout preferred_layout() const override { return Layout::nhwc; }
  bool supports_dtype(DType dtype, std::string* why_not) const override {
    if (dtype == DType::f32 || dtype == DType::f16) return true;
    if (dtype == DType::bf16) {
      if (ctx_->sm_version() >= 80) return true;
      if (why_not) *why_not = "bf16 needs an sm_80 (Ampere) or newer GPU; this is " + ctx_->gpu_name();
      return false;
    }
    if (why_not) *why_not = std::string(dtype_name(dtype)) + " is not a floating compute type";
    return false;
  }
  size_t workspace_bytes() const override { return ctx_->workspace_bytes(); }
  void synchronize() override { ctx_->synchronize(); }
  MemorySpace& memory() override { return ctx_->memory(); }
  MemorySpace& pinned_memory() override { return cuda::pinned_memory(); }
  std::string pci_bus_id() const override {
    char id[32] = {};
    return cudaDeviceGetPCIBusId(id, sizeof id, ctx_->device()) == cudaSuccess ? std::string(id) : std::string();
  }
  std::unique_ptr<Uploader> make_uploader(size_t bytes) override { return cuda::make_uploader(ctx_, bytes); }
  std::string describe() const override {
    return ctx_->gpu_name() + ", implementation mode " + std::string(cuda_impl_mode_name(ctx_->mode())) +
           (ctx_->deterministic() && ctx_->mode() != CudaImplMode::high_precision ? ", deterministic algorithms" : "");
  }

  std::string tuning_state() const override {
    return "cuDNN algorithm cache " + ctx_->algo_cache().path() + ": " + std::to_string(ctx_->algo_cache().size()) +
           " entries (cuDNN " + std::to_string(cudnnGetVersion()) + ", " + ctx_->gpu_name() + ")";
  }
  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override { return cuda::make_conv2d(ctx_, d); }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override {
    return cuda::make_batch_norm(ctx_, d);
  }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override { return cuda::make_relu(ctx_, d); }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override { return cuda::make_add(ctx_, d); }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override { return cuda::make_cast(ctx_, d); }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override { return cuda::make_max_pool(ctx_, d); }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return cuda::make_global_avg_pool(ctx_, d);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override { return cuda::make_linear(ctx_, d); }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return cuda::make_softmax_cross_entropy(ctx_, d);
  }
  std::unique_ptr<CropFlipNormalizeKernel> make_crop_flip_normalize(const CropFlipNormalizeDesc& d) override {
    return cuda::make_crop_flip_normalize(ctx_, d);
  }
  std::unique_ptr<FusedStepKernel> make_fused_step(const FusedStepDesc& d) override {
    return cuda::make_fused_step(ctx_, d);
  }
  std::unique_ptr<StepGraph> make_step_graph() override { return cuda::make_step_graph(ctx_); }
  void* native_stream() override { return ctx_->stream(); }

 private:
  ContextPtr ctx_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace rn

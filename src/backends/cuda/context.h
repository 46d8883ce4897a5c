// What the CUDA kernels of one backend share: the device, one stream, the cuDNN and cuBLAS
// handles, the implementation mode, the device scratch (sized when kernels are made, used
// by one kernel at a time, in stream order), an error flag kernels raise for bad input
// (labels outside [0, K)), the convolution algorithm cache and the device MemorySpace.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_algo_cache.h"
#include "core/memory_space.h"

namespace rn::cuda {

// A backend's device memory. It outlives its Context (see device_memory_for): the model's
// flat buffers are allocated here and may be freed after the backend that placed them is
// gone (a Model declared before its backend), which must not call into a dead object.
class DeviceMemory final : public MemorySpace {
 public:
  explicit DeviceMemory(cudaStream_t stream) : stream_(stream) {}
  Device device() const override { return Device::cuda; }
  void* allocate(size_t bytes) override;
  void free(void* p) noexcept override;
  // Stream-ordered, then synchronised (the host may read or reuse its side at once).
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;  // stream-ordered, asynchronous
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override;
  size_t peak_bytes() const override { return peak_; }
  void reset_peak() override;

 private:
  cudaStream_t stream_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  size_t in_use_ = 0, peak_ = 0;
};

class Context {
 public:
  explicit Context(const CudaBackendOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  CudaImplMode mode() const { return mode_; }
  // Deterministic cuDNN algorithms only: high_precision mode, or run.deterministic.
  bool deterministic() const { return deterministic_; }
  const std::string& gpu_name() const { return gpu_name_; }
  int sm_version() const { return sm_; }
  MemorySpace& memory() { return memory_; }
  CudnnAlgoCache& algo_cache() { return algo_cache_; }

  // The scratch block: reserve() at kernel creation, workspace() when running.
  void reserve(size_t bytes);
  void* workspace() const { return workspace_.data(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // Counts moves of device memory a captured graph holds the address of (reallocations of the
  // workspace, a fused step's grown tables): a graph captured before the last move is stale.
  uint64_t workspace_generation() const { return workspace_generation_; }
  void captured_memory_moved() { ++workspace_generation_; }

  int* error_flags() const { return static_cast<int*>(flags_.data()); }  // [0]: bad label + 1
  // Waits for the stream, then throws if a kernel raised an error flag.
  void synchronize();

 private:
  int device_ = 0;
  CudaImplMode mode_;
  bool deterministic_;
  std::string gpu_name_;
  int sm_ = 0;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory& memory_;  // owned by a process-wide list, never freed (device_memory_for)
  DeviceBuffer workspace_, flags_, cublas_workspace_;
  uint64_t workspace_generation_ = 0;
  CudnnAlgoCache algo_cache_;
};
using ContextPtr = std::shared_ptr<Context>;

// DType -> cuDNN / CUDA data type.
cudnnDataType_t cudnn_dtype(DType t);
cudaDataType_t cuda_dtype(DType t);

// Refuses what the backend does not run, naming the op: NCHW activations, non-floating types.
void require_nhwc(Layout l, const std::string& op);

// Kernel factories (one file per op family).
std::unique_ptr<Conv2dKernel> make_conv2d(const ContextPtr& ctx, const Conv2dDesc& d);
std::unique_ptr<LinearKernel> make_linear(const ContextPtr& ctx, const LinearDesc& d);
std::unique_ptr<BatchNormKernel> make_batch_norm(const ContextPtr& ctx, const BatchNormDesc& d);
std::unique_ptr<ReluKernel> make_relu(const ContextPtr& ctx, const EltwiseDesc& d);
std::unique_ptr<AddKernel> make_add(const ContextPtr& ctx, const EltwiseDesc& d);
std::unique_ptr<CastKernel> make_cast(const ContextPtr& ctx, const CastDesc& d);
std::unique_ptr<MaxPoolKernel> make_max_pool(const ContextPtr& ctx, const MaxPoolDesc& d);
std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d);
std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const ContextPtr& ctx,
                                                                      const SoftmaxCrossEntropyDesc& d);
std::unique_ptr<CropFlipNormalizeKernel> make_crop_flip_normalize(const ContextPtr& ctx,
                                                                  const CropFlipNormalizeDesc& d);
// The input path (upload.cpp): pinned host memory and the copy-stream uploader.
MemorySpace& pinned_memory();
std::unique_ptr<Uploader> make_uploader(const ContextPtr& ctx, size_t bytes);

}  // namespace rn::cuda

// The CUDA backend: cuDNN convolutions, cuBLAS linear layers and our own kernels for batch
// norm (with fused ReLU / add+ReLU), pooling, the loss, element-wise ops and casts, in
// NHWC (NCHW is refused with rn::Unsupported), fp32, fp16 and bf16 with fp32 accumulation.
// Tensors live in device memory (Backend::memory()); all work is queued on one stream.
//
// Convolution algorithms are searched the first time a shape is seen and cached in memory
// and in a file (cudnn_algo_cache.h); `resnet tune` fills the file ahead of time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/build_info.h"
#include "ops/backend.h"

namespace rn {

// high_performance: tensor-op math in half precision, the fastest algorithm cuDNN measures.
// high_precision: as well deterministic algorithms only and no reduced-precision
// reductions in cuBLAS (BN and the loss are fp32-accumulated in both modes).
enum class CudaImplMode : uint8_t { high_performance, high_precision };
std::string_view cuda_impl_mode_name(CudaImplMode m);

struct CudaBackendOptions {
  int device = 0;
  CudaImplMode mode = CudaImplMode::high_performance;
  bool deterministic = false;   // deterministic cuDNN algorithms only (high_precision implies it)
  std::string algo_cache_path;  // empty: $RN_CUDNN_ALGO_CACHE, else ~/.cache/resnet.cpp/cudnn_algos.tsv
};

// Throws rn::Error when no usable GPU is present (make_backend("cuda") then fails and
// `device: auto` picks the CPU).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// Number of usable CUDA devices (0 when there is no driver or no GPU); never throws.
int cuda_device_count(std::string* why_none = nullptr);

// The CUDA runtime, driver ("none" without one), cuDNN and cuBLAS this process runs with, as the
// libraries report themselves; needs no GPU and never throws.
std::vector<LibraryVersion> cuda_library_versions();

}  // namespace rn

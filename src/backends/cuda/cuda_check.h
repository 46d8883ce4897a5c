// Status checks for every CUDA runtime, cuDNN, cuBLAS and NCCL call: a failure throws
// rn::Error naming the call, the file, the line and the library's own message. Every
// kernel launch is followed by RN_CUDA_LAUNCH_CHECK(), which reports launch errors (bad
// configuration, missing kernel image for this GPU) at the launch that caused them.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/check.h"

#define RN_CUDA_CHECK(call)                                                                                        \
  do {                                                                                                             \
    const cudaError_t rn_status_ = (call);                                                                         \
    if (rn_status_ != cudaSuccess)                                                                                 \
      ::rn::detail::Thrower<::rn::Error>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr)               \
                                                 << "CUDA call " #call " failed: " << cudaGetErrorName(rn_status_) \
                                                 << ": " << cudaGetErrorString(rn_status_);                        \
  } while (0)

#define RN_CUDA_LAUNCH_CHECK() RN_CUDA_CHECK(cudaGetLastError())

#define RN_CUDNN_CHECK(call)                                                                         \
  do {                                                                                               \
    const cudnnStatus_t rn_status_ = (call);                                                         \
    if (rn_status_ != CUDNN_STATUS_SUCCESS)                                                          \
      ::rn::detail::Thrower<::rn::Error>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr) \
                                                 << "cuDNN call " #call " failed: "                  \
                                                 << cudnnGetErrorString(rn_status_);                 \
  } while (0)

#define RN_CUBLAS_CHECK(call)                                                                \
  do {                                                                                       \
    const cublasStatus_t rn_status_ = (call);                                                \
    if (rn_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::rn::detail::Thrower<::rn::Error>{} &                                                 \
          ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr)                            \
              << "cuBLAS call " #call " failed: " << cublasGetStatusName(rn_status_) << ": " \
              << cublasGetStatusString(rn_status_);                                          \
  } while (0)

static_assert(CUDNN_MAJOR >= 9, "the cuda backend needs cuDNN 9 or newer (its status codes and sub-libraries)");

namespace rn::cuda {
// Clears a non-sticky error left in this thread's last-error slot by a call that failed and
// was handled (a failed cudaMalloc that became an out-of-memory exception; an allocation
// inside cudnnFind*, which records that algorithm as failed and goes on), so that the next
// RN_CUDA_LAUNCH_CHECK does not blame an innocent kernel for it. A sticky error (the
// context is unusable) stays, and throws here.
inline void clear_nonsticky_error() {
  if (cudaPeekAtLastError() == cudaSuccess) return;
  const cudaError_t e = cudaGetLastError();
  if (cudaPeekAtLastError() != cudaSuccess) RN_CUDA_CHECK(e);
}

// cuDNN 9's statuses come in categories (CUDNN_STATUS_CATEGORY): every code of the "not
// supported" category means that this configuration (shape, type, layout, padding, shared
// memory, launch parameters) has no implementation, except the five that say the
// installation itself is unusable (driver, runtime, architecture, a missing prerequisite or
// sub-library), which are errors.
inline bool cudnn_not_supported(cudnnStatus_t status) {
  if (CUDNN_STATUS_CATEGORY(status) != CUDNN_STATUS_NOT_SUPPORTED) return false;
  switch (status) {
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE:
      return false;
    default:
      return true;
  }
}
}  // namespace rn::cuda

// NCCL is checked the same way where it is used (include nccl.h first).
#define RN_NCCL_CHECK(call)                                                                                           \
  do {                                                                                                                \
    const ncclResult_t rn_status_ = (call);                                                                           \
    if (rn_status_ != ncclSuccess)                                                                                    \
      ::rn::detail::Thrower<::rn::Error>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr)                  \
                                                 << "NCCL call " #call " failed: " << ncclGetErrorString(rn_status_); \
  } while (0)

// Element types on the device and their conversions (round to nearest even, as
// core/dtype.h does on the host), and the dispatch from rn::DType to a C++ type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launch.h"
#include "core/dtype.h"

namespace rn::cuda {

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

}  // namespace rn::cuda

// RN_DISPATCH_FLOAT(dtype, T, body): body with T the device type of a floating dtype.
#define RN_DISPATCH_FLOAT(dtype, T, ...)                                                     \
  switch (dtype) {                                                                           \
    case ::rn::DType::f32: {                                                                 \
      using T = float;                                                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::rn::DType::f16: {                                                                 \
      using T = __half;                                                                      \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::rn::DType::bf16: {                                                                \
      using T = __nv_bfloat16;                                                               \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    default:                                                                                 \
      RN_FAIL() << "cuda backend: " << ::rn::dtype_name(dtype) << " is not a floating type"; \
  }

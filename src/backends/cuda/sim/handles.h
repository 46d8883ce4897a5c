// The emulation's cuDNN and cuBLAS handles (backend_stubs.cpp makes them, cudnn_cublas.cpp
// uses them): the stream their work is queued on, so that a stream capture records it.
#pragma once

#include <cuda_runtime.h>

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

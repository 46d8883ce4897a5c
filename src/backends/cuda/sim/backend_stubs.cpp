// The rest of what the cuda backend's host code calls, for the CPU emulation of the whole
// backend (sim.h): one device and its properties, and cuDNN/cuBLAS handles that hold their
// stream. The convolutions and the GEMM themselves are in cudnn_cublas.cpp; streams, events,
// memory, stream capture and graphs in sim.cpp.
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/sim/handles.h"

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CUDA emulation on the CPU", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device != 0 || len < 1) return cudaErrorInvalidValue;
  std::strncpy(id, "emulation", static_cast<size_t>(len) - 1);
  id[len - 1] = '\0';
  return cudaSuccess;
}


cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  *h = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
size_t cudnnGetVersion(void) { return CUDNN_VERSION; }
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM (emulation: the descriptors or arguments do not describe one convolution)";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT (emulation: NHWC activations and KRSC filters only)";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    default: return "CUDNN_STATUS_NOT_SUPPORTED (emulation)";
  }
}

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "success" : "refused by the emulation's GEMM (sim/cudnn_cublas.cpp)";
}

}  // extern "C"

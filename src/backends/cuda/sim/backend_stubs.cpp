// The rest of what the cuda backend's host code calls, for the CPU emulation of the whole
// backend (sim.h): the devices and their properties, and cuDNN/cuBLAS handles that hold their
// stream. The convolutions and the GEMM themselves are in cudnn_cublas.cpp; streams, events,
// memory, stream capture and graphs in sim.cpp.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/sim/handles.h"

namespace rn::cuda::sim {

thread_local int t_device = 0;

int current_device() { return t_device; }

// $RN_SIM_DEVICES devices (1 to 64; default 1), so that the ranks of a data-parallel job on
// one host each have their own (as NCCL requires). Read at every call: a test may change it.
int device_count() {
  const char* v = std::getenv("RN_SIM_DEVICES");
  if (!v || !*v) return 1;
  char* end = nullptr;
  const long k = std::strtol(v, &end, 10);
  if (*end != '\0' || k < 1 || k > 64) {
    std::fprintf(stderr, "RN_SIM_DEVICES=%s: expected the number of emulated devices, 1 to 64\n", v);
    std::exit(2);
  }
  return static_cast<int>(k);
}

}  // namespace rn::cuda::sim

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = rn::cuda::sim::device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rn::cuda::sim::device_count()) return cudaErrorInvalidDevice;
  rn::cuda::sim::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = rn::cuda::sim::t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= rn::cuda::sim::device_count()) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CUDA emulation on the CPU", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->pciBusID = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device < 0 || device >= rn::cuda::sim::device_count() || len < 1) return cudaErrorInvalidValue;
  std::snprintf(id, static_cast<size_t>(len), "emulation:%d", device);
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

// The versions the emulation was built against; no driver (resnet --version says "none").
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  switch (type) {
    case MAJOR_VERSION:
      *value = CUBLAS_VER_MAJOR;
      return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUBLAS_VER_MINOR;
      return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUBLAS_VER_PATCH;
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
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

#include "backends/cuda/context.h"

#include <deque>

#include "core/log.h"

namespace rn {

std::string_view cuda_impl_mode_name(CudaImplMode m) {
  return m == CudaImplMode::high_performance ? "high_performance" : "high_precision";
}

int cuda_device_count(std::string* why_none) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    int driver = 0;
    if (why_none && e == cudaErrorInsufficientDriver && (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)) {
      // CUDA's text ("driver version is insufficient") reads as "upgrade the driver" when
      // there is no driver at all, the usual case on a machine without a GPU.
      *why_none = "no NVIDIA driver is installed on this machine";
    } else if (why_none) {
      *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    }
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return 0;
  }
  if (n == 0 && why_none) *why_none = "cudaGetDeviceCount reports no CUDA device";
  return n;
}

namespace {
// CUDA's "1000 * major + 10 * minor" version numbers: 13000 -> "13.0".
std::string cuda_style_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
}  // namespace

std::vector<LibraryVersion> cuda_library_versions() {
  std::vector<LibraryVersion> out;
  int runtime = 0, driver = 0;
  out.push_back({"CUDA runtime", cudaRuntimeGetVersion(&runtime) == cudaSuccess ? cuda_style_version(runtime)
                                                                                : std::string("unknown")});
  // 0 when no driver is installed: the build has CUDA, this machine cannot run it.
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  out.push_back({"CUDA driver", have_driver ? cuda_style_version(driver) : std::string("none")});
  cudaGetLastError();
  // cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch; cuDNN 8 used 1000 for major.
  const size_t dnn = cudnnGetVersion();
  const size_t dnn_major_unit = dnn >= 90000 ? 10000 : 1000;
  out.push_back({"cuDNN", std::to_string(dnn / dnn_major_unit) + "." + std::to_string(dnn % dnn_major_unit / 100) +
                              "." + std::to_string(dnn % 100)});
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    out.push_back({"cuBLAS", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch)});
  else
    out.push_back({"cuBLAS", "unknown"});
  return out;
}

namespace cuda {

void* DeviceMemory::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (e != cudaSuccess) {
    clear_nonsticky_error();  // the caller may catch this and go on (bench --find-max-batch does)
    RN_FAIL() << "out of device memory allocating " << bytes << " bytes: " << cudaGetErrorString(e);
  }
  std::lock_guard lock(mutex_);
  sizes_[p] = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void DeviceMemory::reset_peak() {
  std::lock_guard lock(mutex_);
  peak_ = in_use_;
}

void DeviceMemory::free(void* p) noexcept {
  if (!p) return;
  cudaFree(p);
  std::lock_guard lock(mutex_);
  if (auto it = sizes_.find(p); it != sizes_.end()) {
    in_use_ -= it->second;
    sizes_.erase(it);
  }
}

void DeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  RN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  RN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceMemory::copy_to_device_async(void* dst, const void* src, size_t bytes) {
  if (bytes) RN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void DeviceMemory::zero(void* p, size_t bytes) {
  if (bytes) RN_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
}

namespace {
// Every DeviceMemory made lives until the process ends: freeing a buffer through it stays
// valid after its Context is destroyed (it only calls cudaFree and updates its own
// counters). Its copies use the Context's stream, so they must not outlive the Context.
DeviceMemory& device_memory_for(cudaStream_t stream) {
  static std::mutex mutex;
  static std::deque<std::unique_ptr<DeviceMemory>> spaces;
  std::lock_guard lock(mutex);
  spaces.push_back(std::make_unique<DeviceMemory>(stream));
  return *spaces.back();
}

cudaStream_t make_stream(int device) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) RN_FAIL() << "cuda backend: no usable GPU (" << why << ")";
  RN_CHECK(device >= 0 && device < n) << "cuda backend: device " << device << " requested, " << n << " present";
  RN_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  RN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
}  // namespace

Context::Context(const CudaBackendOptions& o)
    : device_(o.device),
      mode_(o.mode),
      deterministic_(o.deterministic || o.mode == CudaImplMode::high_precision),
      stream_(make_stream(o.device)),
      memory_(device_memory_for(stream_)),
      algo_cache_(o.algo_cache_path) {
  cudaDeviceProp prop{};
  RN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  gpu_name_ = prop.name;
  sm_ = prop.major * 10 + prop.minor;
  RN_CUDNN_CHECK(cudnnCreate(&cudnn_));
  RN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  RN_CUBLAS_CHECK(cublasCreate(&cublas_));
  RN_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // high_precision: no reduced-precision reductions inside cuBLAS's half GEMMs.
  RN_CUBLAS_CHECK(cublasSetMathMode(
      cublas_, mode_ == CudaImplMode::high_precision
                   ? static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
                   : CUBLAS_DEFAULT_MATH));
  // A workspace of our own, so that cuBLAS allocates nothing inside a captured graph.
  cublas_workspace_ = DeviceBuffer(memory_, size_t{32} << 20);
  RN_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.bytes()));
  flags_ = DeviceBuffer(memory_, 64);
  flags_.zero();
  RN_LOG_INFO("cuda backend: {} (sm_{}), cuDNN {}, implementation mode {}, algorithm cache {}", gpu_name_, sm_,
              cudnnGetVersion(), cuda_impl_mode_name(mode_), algo_cache_.path());
  // One major version links (libcudnn.so.9), but an older minor than the headers' is the first
  // suspect when a cuDNN call fails (a wheel's cuDNN ahead on the library path).
  if (cudnnGetVersion() < static_cast<size_t>(CUDNN_VERSION))
    RN_LOG_WARN(
        "cuda backend: built against cuDNN {}, running with the older {} found on the library path; if a "
        "cuDNN call fails, put a cuDNN at least as new first on LD_LIBRARY_PATH",
        CUDNN_VERSION, cudnnGetVersion());
}

Context::~Context() {
  if (stream_) cudaStreamSynchronize(stream_);
  workspace_ = DeviceBuffer();
  flags_ = DeviceBuffer();
  cublas_workspace_ = DeviceBuffer();
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) cudaStreamDestroy(stream_);
}

void Context::reserve(size_t bytes) {
  if (bytes <= workspace_.bytes()) return;
  if (workspace_.data()) RN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing may still use the old one
  workspace_ = DeviceBuffer(memory_, bytes);
  ++workspace_generation_;
}

void Context::synchronize() {
  RN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  int flags[1] = {0};
  RN_CUDA_CHECK(cudaMemcpyAsync(flags, flags_.data(), sizeof(flags), cudaMemcpyDeviceToHost, stream_));
  RN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (flags[0] != 0) {
    RN_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, sizeof(int), stream_));
    RN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    RN_FAIL() << "cuda backend: softmax_cross_entropy: the label of sample " << flags[0] - 1
              << " is outside [0, classes)";
  }
}

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      RN_FAIL() << "cuda backend: no cuDNN type for " << dtype_name(t);
  }
}

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      RN_FAIL() << "cuda backend: no CUDA type for " << dtype_name(t);
  }
}

void require_nhwc(Layout l, const std::string& op) {
  if (l != Layout::nhwc) RN_UNSUPPORTED() << "cuda backend, " << op << ": runs NHWC activations only";
}

}  // namespace cuda
}  // namespace rn

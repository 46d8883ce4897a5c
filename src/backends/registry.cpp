#include <sstream>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "backends/ref/ref_backend.h"
#include "core/check.h"
#include "ops/backend.h"
#ifdef RN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace rn {

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"ref", "cpu"};
#ifdef RN_HAVE_CUDA
  names.push_back("cuda");
#endif
  return names;
}

int accelerator_count() {
#ifdef RN_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

std::vector<LibraryVersion> backend_library_versions() {
  std::vector<LibraryVersion> out = {{"oneDNN", onednn_version()}};
#ifdef RN_HAVE_CUDA
  for (LibraryVersion& l : cuda_library_versions()) out.push_back(std::move(l));
#endif
  return out;
}

std::unique_ptr<Backend> make_backend(const std::string& name, [[maybe_unused]] const BackendOptions& options) {
  if (name == "ref") return make_ref_backend();
  if (name == "cpu") {
    CpuBackendOptions o;
    o.winograd = !options.high_precision;
    o.bf16_conv_arithmetic = options.cpu_bf16_conv_arithmetic;
    return make_cpu_backend(o);
  }
#ifdef RN_HAVE_CUDA
  if (name == "cuda") {
    CudaBackendOptions o;
    o.mode = options.high_precision ? CudaImplMode::high_precision : CudaImplMode::high_performance;
    o.deterministic = options.deterministic;
    o.device = options.device;
    return make_cuda_backend(o);
  }
#endif
  std::ostringstream list;
  for (const auto& n : available_backends()) list << " " << n;
  RN_FAIL() << "unknown or unavailable backend '" << name << "'; this build has:" << list.str()
            << (name == "cuda" ? " (the CUDA backend was not built: configure found no nvcc/cuDNN)" : "");
}

}  // namespace rn

// What the tests of our CUDA kernels share (cuda_kernels_test.cpp, cuda_fused_step_test.cpp).
// They are built twice: into test_ops, where they run on a GPU and skip with a visible line
// without one, and into test_cuda_sim (RN_CUDA_SIM), where the same kernels run in the CPU
// emulation (backends/cuda/sim) and the CUDA runtime calls below are the emulation's.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/rng.h"

#ifdef RN_CUDA_SIM
#define RN_REQUIRE_GPU() (void)0
#else
#include "staged_backend.h"
// staged_backend.h's cuda_usable(): the cuda backend starts (a GPU and its libraries).
#define RN_REQUIRE_GPU()                                                       \
  do {                                                                         \
    std::string why_;                                                          \
    if (!cuda_usable(&why_)) GTEST_SKIP() << "cuda kernels not run: " << why_; \
  } while (0)
#endif

namespace rn::cuda::testing {

inline size_t elem_size(DType t) { return t == DType::f32 ? 4 : 2; }

// A device buffer holding n elements of type t, `offset` elements past a 256-byte-aligned
// allocation (offset 1: no vector access is possible). Nothing past the n elements, so an
// access beyond them is out of bounds for the sanitizers (compute-sanitizer on the GPU, the
// address sanitizer in the emulation).
class Buf {
 public:
  Buf(DType t, size_t n, size_t offset = 0) : t_(t), n_(n), offset_(offset) {
    RN_CUDA_CHECK(cudaMalloc(&base_, (n + offset) * elem_size(t)));
    // cudaMemset is asynchronous on the legacy default stream, which the backend's stream
    // does not wait for: without this wait the zeros could land after a kernel's output.
    RN_CUDA_CHECK(cudaMemset(base_, 0, (n + offset) * elem_size(t)));
    RN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Buf() { cudaFree(base_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* data() const { return static_cast<char*>(base_) + offset_ * elem_size(t_); }
  float* f() const { return static_cast<float*>(data()); }
  // Waits until the data is on the device: a copy from pageable memory may return before
  // it lands, and the backend's kernels run on a stream of their own that does not wait for
  // the default stream.
  void set(const std::vector<float>& v) {
    std::vector<char> raw(v.size() * elem_size(t_));
    convert(raw.data(), t_, v.data(), DType::f32, v.size());
    RN_CUDA_CHECK(cudaMemcpy(data(), raw.data(), raw.size(), cudaMemcpyHostToDevice));
    RN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> get() const {
    RN_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<char> raw(n_ * elem_size(t_));
    RN_CUDA_CHECK(cudaMemcpy(raw.data(), data(), raw.size(), cudaMemcpyDeviceToHost));
    std::vector<float> v(n_);
    convert(v.data(), DType::f32, raw.data(), t_, n_);
    return v;
  }

 private:
  DType t_;
  size_t n_, offset_;
  void* base_ = nullptr;
};

// Values already representable in t, so the host and the device start from the same bits.
inline std::vector<float> random_values(DType t, size_t n, Rng& rng, float mean = 0.0f, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = round_to_dtype(mean + scale * rng.normal(), t);
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      *where = "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return false;
    }
  return true;
}

}  // namespace rn::cuda::testing

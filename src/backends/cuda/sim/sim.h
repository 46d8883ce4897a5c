// The CPU emulation of our CUDA kernels. A .cu file compiled by the host compiler with this
// header force-included (-include backends/cuda/sim/sim.h) runs its kernels on the host:
// every CUDA thread of a block is a fiber, __syncthreads() switches to the next fiber until
// the whole block has arrived, and __shared__ memory is one static array per kernel. A launch
// is work on its stream, run when something waits for the stream (sim.cpp, "deferred
// work"); its blocks then run one after another on the host thread that waits.
//
// It exists so that CI, which has no GPU, runs the kernels themselves, not only their
// arithmetic (ops/fused_math.h) and their division of work (tiling.h). With backend_stubs.cpp
// and cudnn_cublas.cpp (cuDNN's convolutions and cuBLAS's GEMM as plain loops) the backend's
// host code runs too: make_backend("cuda") works in the emulation (docs/gpu.md, "Our kernels
// on the CPU"). Beyond the results it
// checks what a GPU would fault on or leave undefined, and reports it through
// cudaGetLastError() as a sticky error naming the kernel and the thread:
//   - a launch configuration the GPU refuses (no threads, more than 1024 per block, grid
//     limits);
//   - a vector access at a misaligned address (RN_SIM_CHECK_ALIGNED, launch.h);
//   - a barrier that not every thread of the block reaches, or that threads reach at
//     different __syncthreads() calls (undefined behaviour in CUDA). A call is told apart by
//     its source line only: threads waiting at one __syncthreads() in a helper called from
//     two places are not told apart.
// Out-of-bounds accesses are the address sanitizer's job: the emulation's tests are built
// with -fsanitize=address,undefined, and cudaMalloc here is an exact-size host allocation.
//
// What it cannot show: timing, memory coalescing, races between threads that a barrier does
// not order (fibers run in a fixed order), races between streams (work runs when it is
// queued), and anything of cuDNN, cuBLAS or NCCL themselves (sim/nccl_sim.cpp carries NCCL's
// collectives over MPI between processes).
#pragma once

#define RN_CUDA_SIM 1

// CUDA's execution-space keywords, as plain C++. crt/host_defines.h keeps definitions made
// before it. __shared__: one static array per kernel instantiation, which every fiber of the
// running block sees (a plain static, not thread_local, so that the address sanitizer
// guards it; launches from several host threads take turns, sim.cpp).
#define __host__
#define __device__
#define __global__
#define __shared__ static

#include <cuda_runtime.h>  // dim3, uint3, cudaStream_t; sim.cpp defines the calls we use

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rn::cuda::sim {

extern thread_local uint3 thread_idx, block_idx;
extern thread_local dim3 block_dim, grid_dim;

// Runs body() once per thread of every block of the grid. `name`: the kernel, for messages.
void run(const char* name, dim3 grid, dim3 block, const std::function<void()>& body);

// A barrier of the current block; `site` tells the __syncthreads() calls apart. Returns
// whether any thread of the block arrived with pred != 0.
bool barrier(bool pred, const std::source_location& site);

// Records a fault for the running launch (the first one wins) and ends the calling thread's
// part in it; the launch stops and cudaGetLastError() reports it.
[[noreturn]] void fault(cudaError_t code, const char* what);

// Stream capture (CUDA graphs): while this host thread captures `stream`, work queued on it
// is recorded, not run, and cudaGraphLaunch runs the recording. Returns whether `op` was
// recorded (or refused: work on the legacy default stream during a capture breaks it, as on
// a GPU); false: run it now.
// Work queued on a stream the capture includes (the captured stream, and the streams that
// joined it by waiting for an event recorded in it) is recorded, in issue order.
bool capture(cudaStream_t stream, const std::function<void()>& op, const char* what);

// For a library call that allocates or waits (cuDNN's algorithm search): true outside a
// stream capture; during one, it invalidates the capture (cudaErrorStreamCaptureUnsupported,
// naming `what`), as on a GPU, and returns false.
bool allowed_outside_capture(const char* what);

// Queues `op` on `stream` (sim.cpp, "deferred work"): recorded when a capture includes the
// stream; otherwise it runs when something waits for the stream. Returns the stream's count
// of queued work (0: it ran or was recorded).
uint64_t submit(cudaStream_t stream, const std::function<void()>& op, const char* what);
// Runs `stream`'s queued work, its first `upto` ops at least.
void drain(cudaStream_t stream, uint64_t upto);
// Runs every stream's queued work (only the blocking streams': what the legacy stream waits for).
void drain_streams(bool blocking_only);
// Whether `stream` has run its first `position` ops.
bool ran(cudaStream_t stream, uint64_t position);
// Refuses (returns false, the last error says why) a grid a GPU would not launch.
bool launch_config_ok(const char* name, dim3 grid, dim3 block);

// The calling host thread's current device (cudaSetDevice); the emulation has
// $RN_SIM_DEVICES devices (default 1), all alike, all on host memory.
int current_device();
int device_count();

// Whether a kernel may be launched on `stream` now: a GPU refuses a launch into a stream of
// another device than the calling thread's current one (cudaErrorInvalidResourceHandle,
// recorded as the last error naming `what`; returns false).
bool launchable(cudaStream_t stream, const char* what);

// The device of `stream` (the legacy default stream's: the current one); -1: unknown.
int stream_device(cudaStream_t stream);

// Whether this host thread's device has failed (a sticky error: nothing more runs on it).
bool device_failed();

// Whether [p, p + bytes) lies in one block of memory from cudaMalloc or cudaHostAlloc.
bool is_allocated(const void* p, size_t bytes);

// Records `code` as the last CUDA error with `message` (sticky: every later call reports it).
void set_error(cudaError_t code, std::string message, bool sticky);

inline void check_aligned(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) fault(cudaErrorMisalignedAddress, "misaligned vector access");
}

template <typename... P>
struct Launch {
  const char* name;
  dim3 grid, block;
  cudaStream_t stream;
  void (*kernel)(P...);
  // Every thread gets its own copies of the arguments, converted as a launch converts them.
  // The grid runs when the stream's work does (or at every replay of a capture).
  template <typename... A>
  void operator()(A&&... a) const {
    auto args = std::make_shared<const std::tuple<std::decay_t<A>...>>(std::forward<A>(a)...);
    void (*k)(P...) = kernel;
    const char* n = name;
    const dim3 g = grid, b = block;
    const std::function<void()> go = [=] {
      run(n, g, b, [&] { std::apply([k](const auto&... v) { k(v...); }, *args); });
    };
    if (!launchable(stream, n) || !launch_config_ok(n, g, b)) return;
    submit(stream, go, n);
  }
};

template <typename... P>
Launch<P...> launch(const char* name, dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(P...)) {
  return Launch<P...>{name, grid, block, stream, kernel};
}

}  // namespace rn::cuda::sim

#define threadIdx (::rn::cuda::sim::thread_idx)
#define blockIdx (::rn::cuda::sim::block_idx)
#define blockDim (::rn::cuda::sim::block_dim)
#define gridDim (::rn::cuda::sim::grid_dim)

inline void __syncthreads(const std::source_location site = std::source_location::current()) {
  ::rn::cuda::sim::barrier(false, site);
}
inline int __syncthreads_or(int pred, const std::source_location site = std::source_location::current()) {
  return ::rn::cuda::sim::barrier(pred != 0, site) ? 1 : 0;
}

inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
// Fibers of a block never run at once, so a plain read-modify-write is atomic here.
inline int atomicCAS(int* address, int compare, int value) {
  const int old = *address;
  if (old == compare) *address = value;
  return old;
}
// CUDA's integer min/max, which device code calls unqualified.
using std::max;
using std::min;

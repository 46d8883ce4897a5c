// The CPU emulation's scheduler (one fiber per CUDA thread, switched by a few instructions of
// x86-64 assembly) and the few CUDA runtime calls our kernels' launchers and tests make, on
// host memory. See sim.h.
#include "backends/cuda/sim/sim.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA kernel emulation switches fibers in x86-64 assembly (CMake builds it only there)"
#endif
#if defined(__CET__) && (__CET__ & 2)
#error "the CUDA kernel emulation's fiber switch returns into another stack: build it without shadow stacks"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define RN_SIM_ASAN 1
#endif

// rn_sim_switch(&save, to): saves the callee-saved registers and the SSE/x87 control words
// on the current stack, stores the stack pointer in *save, and resumes the stack `to`
// (x86-64 System V). No system call, unlike swapcontext, which sets the signal mask at every
// switch: the emulation switches at every barrier of every thread.
extern "C" void rn_sim_switch(void** save, void* to);
asm(R"(
  .pushsection .text
  .globl rn_sim_switch
  .type rn_sim_switch, @function
rn_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rn_sim_switch, .-rn_sim_switch
  .popsection
)");

namespace rn::cuda::sim {

thread_local uint3 thread_idx, block_idx;
thread_local dim3 block_dim, grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // the address sanitizer's frames are large

enum class State { ready, waiting, done, faulted };

struct Fiber {
  void* sp = nullptr;  // the saved stack pointer while the fiber is switched out
  std::unique_ptr<char[]> stack;
  State state = State::ready;
  uint3 index{};
  bool pred = false;
  std::source_location site;
};

// The launch running on this host thread.
struct Block {
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;  // kept between launches: the stacks are reused
  size_t current = 0;
  void* scheduler_sp = nullptr;
  bool faulted = false;
#ifdef RN_SIM_ASAN
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

thread_local Block t_block;

// The runtime's error state: the last error, sticky once a kernel faulted (as a GPU's is).
struct ErrorState {
  cudaError_t last = cudaSuccess;
  bool sticky = false;
  std::string message;
};
thread_local ErrorState t_error;

void set_error(cudaError_t code, std::string message, bool sticky) {
  if (t_error.sticky) return;
  t_error.last = code;
  t_error.message = std::move(message);
  t_error.sticky = sticky;
}

std::string dims(const uint3& d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", d.x, d.y, d.z);
  return buf;
}
std::string dims(const dim3& d) { return dims(uint3{d.x, d.y, d.z}); }

// Fiber <-> scheduler switches, told to the address sanitizer (it tracks one stack per
// fiber).
void to_fiber(Fiber& f) {
#ifdef RN_SIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.get(), kStackBytes);
  rn_sim_switch(&t_block.scheduler_sp, f.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  rn_sim_switch(&t_block.scheduler_sp, f.sp);
#endif
}

void to_scheduler(Fiber& f, bool finished) {
#ifdef RN_SIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, t_block.scheduler_stack, t_block.scheduler_stack_size);
  rn_sim_switch(&f.sp, t_block.scheduler_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)finished;
  rn_sim_switch(&f.sp, t_block.scheduler_sp);
#endif
}

[[noreturn]] void fiber_main() noexcept {
  Fiber& f = t_block.fibers[t_block.current];
#ifdef RN_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &t_block.scheduler_stack, &t_block.scheduler_stack_size);
#endif
  (*t_block.body)();
  f.state = State::done;
  to_scheduler(f, true);
  std::abort();  // a finished fiber is never resumed
}

// A fresh fiber's stack as rn_sim_switch leaves a switched-out one: the control words, six
// callee-saved registers and, as the return address, fiber_main. Entered by `ret`, with the
// stack pointer 8 off a 16-byte boundary, as after a call.
void* fresh_stack(char* stack) {
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
#ifdef RN_SIM_ASAN
  // An earlier fiber's frames may have left redzones poisoned where this one starts.
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(top - 128), 128);
#endif
  auto* slot = reinterpret_cast<uint64_t*>(top - 16);
  slot[0] = reinterpret_cast<uint64_t>(&fiber_main);
  for (int r = 1; r <= 6; ++r) slot[-r] = 0;  // rbp, rbx, r12-r15
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  auto* control = reinterpret_cast<uint32_t*>(&slot[-7]);
  control[0] = mxcsr;
  control[1] = fpucw;
  return &slot[-7];
}

void launch_fault(cudaError_t code, const std::string& what) {
  if (!t_block.faulted)
    set_error(code, std::string(t_block.kernel) + ": " + what, /*sticky=*/true);
  t_block.faulted = true;
}

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string site_str(const std::source_location& s) {
  return std::string(s.file_name()) + ":" + std::to_string(s.line());
}

// Runs one block to its end; false when it faulted.
bool run_block(size_t n) {
  Block& b = t_block;
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    if (!f.stack) f.stack.reset(new char[kStackBytes]);  // not zeroed: untouched pages cost nothing
    f.state = State::ready;
    f.pred = false;
    f.index = uint3{static_cast<unsigned>(i % block_dim.x), static_cast<unsigned>(i / block_dim.x % block_dim.y),
                    static_cast<unsigned>(i / (block_dim.x * block_dim.y))};
    f.sp = fresh_stack(f.stack.get());
  }
  for (;;) {
    size_t done = 0, waiting = 0;
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = b.fibers[i];
      if (f.state == State::ready) {
        b.current = i;
        thread_idx = f.index;
        to_fiber(f);
      }
      if (f.state == State::faulted || b.faulted) return false;
      if (f.state == State::done) ++done;
      if (f.state == State::waiting) ++waiting;
    }
    if (done == n) return true;
    // Every live thread waits at a barrier: it must be all of them, at one call.
    const Fiber* first = nullptr;
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const Fiber& f = b.fibers[i];
      if (f.state != State::waiting) continue;
      if (!first) first = &f;
      if (!same_site(first->site, f.site)) {
        launch_fault(cudaErrorIllegalInstruction, "threads " + dims(first->index) + " and " + dims(f.index) +
                                                      " of block " + dims(block_idx) + " wait at different barriers (" +
                                                      site_str(first->site) + ", " + site_str(f.site) + ")");
        return false;
      }
      any = any || f.pred;
    }
    if (done > 0) {
      launch_fault(cudaErrorIllegalInstruction, std::to_string(done) + " of the " + std::to_string(n) +
                                                    " threads of block " + dims(block_idx) +
                                                    " ended without reaching the barrier at " +
                                                    site_str(first->site));
      return false;
    }
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = b.fibers[i];
      f.pred = any;
      f.state = State::ready;
    }
  }
}

}  // namespace

bool barrier(bool pred, const std::source_location& site) {
  Block& b = t_block;
  Fiber& f = b.fibers[b.current];
  f.state = State::waiting;
  f.pred = pred;
  f.site = site;
  to_scheduler(f, false);
  thread_idx = f.index;
  return f.pred;
}

void fault(cudaError_t code, const char* what) {
  Block& b = t_block;
  Fiber& f = b.fibers[b.current];
  launch_fault(code, std::string(what) + " in thread " + dims(f.index) + " of block " + dims(block_idx));
  f.state = State::faulted;
  to_scheduler(f, /*finished=*/true);  // never resumed: the sanitizer may drop its fake stack
  std::abort();  // a faulted fiber is never resumed
}

void run(const char* name, dim3 grid, dim3 block, const std::function<void()>& body) {
  const std::string cfg = std::string(name) + " <<<" + dims(grid) + ", " + dims(block) + ">>>";
  if (t_error.sticky) return;  // as on a GPU: nothing runs after a fault
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    set_error(cudaErrorInvalidConfiguration, cfg + ": an empty grid or block", false);
    return;
  }
  if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 2147483647u) {
    set_error(cudaErrorInvalidConfiguration, cfg + ": beyond the GPU's launch limits", false);
    return;
  }
  Block& b = t_block;
  if (b.body) {
    set_error(cudaErrorNotSupported, cfg + ": a launch from inside a kernel", true);
    return;
  }
  // __shared__ arrays are plain statics (sim.h): launches from several host threads take turns.
  static std::mutex launch_mutex;
  const std::lock_guard lock(launch_mutex);
  b.kernel = name;
  b.body = &body;
  b.faulted = false;
  if (b.fibers.size() < threads) b.fibers.resize(threads);
  grid_dim = grid;
  block_dim = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_idx = uint3{x, y, z};
        if (!run_block(threads)) {
          b.body = nullptr;
          return;
        }
      }
  b.body = nullptr;
}

// ---- memory and streams ---------------------------------------------------------------------
namespace {

// What cudaMalloc and cudaHostAlloc handed out: the only memory a captured copy may touch
// (ordinary, pageable host memory cannot be a node of a graph).
struct Allocations {
  std::mutex mutex;
  std::map<uintptr_t, size_t> blocks;  // begin -> bytes
  void add(const void* p, size_t n) {
    const std::lock_guard lock(mutex);
    blocks[reinterpret_cast<uintptr_t>(p)] = n;
  }
  void remove(const void* p) {
    const std::lock_guard lock(mutex);
    blocks.erase(reinterpret_cast<uintptr_t>(p));
  }
  bool covers(const void* p, size_t n) {
    const std::lock_guard lock(mutex);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return false;
    --it;
    return a + n <= it->first + std::max<size_t>(it->second, 1);
  }
};
Allocations& allocations() {
  static Allocations a;
  return a;
}

// Streams made non-blocking do not synchronise with the legacy default stream.
std::mutex g_streams_mutex;
std::map<cudaStream_t, bool> g_non_blocking;
bool non_blocking(cudaStream_t s) {
  const std::lock_guard lock(g_streams_mutex);
  const auto it = g_non_blocking.find(s);
  return it != g_non_blocking.end() && it->second;
}

}  // namespace

// ---- stream capture -----------------------------------------------------------------------
namespace {

using Ops = std::vector<std::function<void()>>;

// The capture this host thread runs (cudaStreamCaptureModeThreadLocal, as step_graph.cpp
// asks): what is queued on `stream` is recorded; what a GPU refuses during a capture (a
// synchronisation with the captured stream, the legacy default stream, an allocation)
// invalidates it, and the call returns the GPU's error.
struct CaptureState {
  bool active = false, invalidated = false;
  cudaStream_t stream = nullptr;
  Ops ops;
};
thread_local CaptureState t_capture;

cudaError_t invalidate_capture(cudaError_t code, const std::string& what) {
  t_capture.invalidated = true;
  set_error(code, what + " during a stream capture (not allowed on a GPU; the capture is invalidated)", false);
  return code;
}

}  // namespace

bool capture(cudaStream_t stream, const std::function<void()>& op, const char* what) {
  if (!t_capture.active) return false;
  if (stream == t_capture.stream) {
    if (!t_capture.invalidated) t_capture.ops.push_back(op);
    return true;
  }
  if (stream == nullptr && !non_blocking(t_capture.stream)) {
    // The legacy default stream would wait for the (blocking) captured stream.
    invalidate_capture(cudaErrorStreamCaptureImplicit, std::string(what) + " on the legacy default stream");
    return true;
  }
  return false;  // a stream the capture does not include runs its work now
}

}  // namespace rn::cuda::sim

// ---- the CUDA runtime calls we use, on host memory ---------------------------------------
using rn::cuda::sim::t_error;
using rn::cuda::sim::t_capture;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_error.last;
  if (!t_error.sticky) {
    t_error.last = cudaSuccess;
    t_error.message.clear();
  }
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_error.last; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorIllegalInstruction: return "cudaErrorIllegalInstruction";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaError (emulation)";
  }
}

// The emulation's message for the current error names the kernel and the thread.
const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == t_error.last && !t_error.message.empty()) return t_error.message.c_str();
  return cudaGetErrorName(error);
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return cudaErrorInvalidValue;
  *p = nullptr;
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaMalloc");
  // 256-byte aligned, as cudaMalloc's are, and exactly `bytes` long for the sanitizer.
  if (bytes && posix_memalign(p, 256, bytes) != 0) return cudaErrorMemoryAllocation;
  if (*p) rn::cuda::sim::allocations().add(*p, bytes);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaFree");
  rn::cuda::sim::allocations().remove(p);
  std::free(p);
  return t_error.sticky ? t_error.last : cudaSuccess;
}

// Pinned host memory: host memory the emulation knows (captured copies may use it).
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  rn::cuda::sim::allocations().add(*p, bytes);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  rn::cuda::sim::allocations().remove(p);
  std::free(p);
  return cudaSuccess;
}

// Streams and events are distinct non-null tokens: work runs when it is queued (or is
// recorded by a capture), so a stream is always idle and an event always complete.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = reinterpret_cast<cudaStream_t>(new char[1]);
  const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
  rn::cuda::sim::g_non_blocking[*s] = (flags & cudaStreamNonBlocking) != 0;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
    rn::cuda::sim::g_non_blocking.erase(s);
  }
  delete[] reinterpret_cast<char*>(s);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new char[1]);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete[] reinterpret_cast<char*>(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaPeekAtLastError(); }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaPeekAtLastError(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaPeekAtLastError(); }

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureImplicit, "cudaMemset");
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureImplicit, "cudaMemcpy");
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active && s == t_capture.stream && bytes &&
      !(rn::cuda::sim::allocations().covers(src, bytes) && rn::cuda::sim::allocations().covers(dst, bytes)))
    return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported,
                                             "cudaMemcpyAsync to or from pageable host memory");
  const auto op = [=] {
    if (bytes) std::memmove(dst, src, bytes);
  };
  if (!rn::cuda::sim::capture(s, op, "cudaMemcpyAsync")) op();
  return t_error.last == cudaErrorStreamCaptureImplicit ? cudaGetLastError() : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  const auto op = [=] {
    if (bytes) std::memset(p, value, bytes);
  };
  if (!rn::cuda::sim::capture(s, op, "cudaMemsetAsync")) op();
  return t_error.last == cudaErrorStreamCaptureImplicit ? cudaGetLastError() : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active)
    return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active && (s == t_capture.stream || s == nullptr))
    return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
  return cudaSuccess;
}

// Graphs: a recording of the captured work, run in order by cudaGraphLaunch.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active || s == nullptr) return cudaErrorIllegalState;
  t_capture = {};
  t_capture.active = true;
  t_capture.stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!t_capture.active || s != t_capture.stream) return cudaErrorIllegalState;
  const bool invalidated = t_capture.invalidated;
  auto* ops = new rn::cuda::sim::Ops(std::move(t_capture.ops));
  t_capture = {};
  if (invalidated) {
    delete ops;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = reinterpret_cast<cudaGraph_t>(ops);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = !t_capture.active || s != t_capture.stream ? cudaStreamCaptureStatusNone
            : t_capture.invalidated                    ? cudaStreamCaptureStatusInvalidated
                                                       : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new rn::cuda::sim::Ops(*reinterpret_cast<rn::cuda::sim::Ops*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (t_error.sticky) return t_error.last;
  if (!exec) return cudaErrorInvalidValue;
  for (const auto& op : *reinterpret_cast<rn::cuda::sim::Ops*>(exec)) {
    op();
    if (t_error.last != cudaSuccess) return cudaGetLastError();  // a replayed launch failed
  }
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<rn::cuda::sim::Ops*>(graph);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<rn::cuda::sim::Ops*>(exec);
  return cudaSuccess;
}

}  // extern "C"

// The CPU emulation's scheduler (one fiber per CUDA thread, switched by a few instructions of
// x86-64 assembly) and the few CUDA runtime calls our kernels' launchers and tests make, on
// host memory. See sim.h.
#include "backends/cuda/sim/sim.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
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
  // The error cudaGetLastError() last handed out and cleared, whose message
  // cudaGetErrorString() still gives (RN_CUDA_CHECK(cudaGetLastError()) asks after clearing).
  cudaError_t cleared = cudaSuccess;
  std::string cleared_message;
};
thread_local ErrorState t_error;

}  // namespace

void set_error(cudaError_t code, std::string message, bool sticky) {
  if (t_error.sticky) return;
  t_error.last = code;
  t_error.message = std::move(message);
  t_error.sticky = sticky;
}

namespace {

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

bool launch_config_ok(const char* name, dim3 grid, dim3 block) {
  const std::string cfg = std::string(name) + " <<<" + dims(grid) + ", " + dims(block) + ">>>";
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    set_error(cudaErrorInvalidConfiguration, cfg + ": an empty grid or block", false);
    return false;
  }
  if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 2147483647u) {
    set_error(cudaErrorInvalidConfiguration, cfg + ": beyond the GPU's launch limits", false);
    return false;
  }
  return true;
}

void run(const char* name, dim3 grid, dim3 block, const std::function<void()>& body) {
  const std::string cfg = std::string(name) + " <<<" + dims(grid) + ", " + dims(block) + ">>>";
  if (t_error.sticky) return;  // as on a GPU: nothing runs after a fault
  if (!launch_config_ok(name, grid, block)) return;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
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

// ---- memory, streams and events ------------------------------------------------------------
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

}  // namespace

// The emulated GPU's memory, an H200's: one cudaMalloc larger than that fails as on the GPU
// (host memory backs what is handed out).
constexpr size_t kDeviceMemoryBytes = size_t{141} << 30;

namespace {

// Work runs when it is queued (or is recorded by a capture), so a stream is always idle and
// an event complete when its record returns. What they keep is what a GPU would check.
struct StreamInfo {
  bool non_blocking = false;  // does not synchronise with the legacy default stream
  int device = 0;
};
struct EventInfo {
  bool timing = true;  // not made with cudaEventDisableTiming
  int device = 0;
  bool recorded = false;
  double when_ms = 0;  // the host clock when it was recorded (its work was done then)
  // Last recorded in a capture (its id; 0: not): it only orders captured work, and what
  // examines its completion is refused (cudaErrorCapturedEvent).
  uint64_t capture = 0;
  // In a capture: the stream and its last node then. Otherwise: the stream and the count of
  // its queued work that the event completes after (0: complete when recorded).
  cudaStream_t stream = nullptr;
  uint64_t position = 0;
  uint64_t generation = 0;  // records so far (a later record replaces an earlier one)
};
std::mutex g_streams_mutex;  // guards both maps
std::map<cudaStream_t, StreamInfo> g_streams;
std::map<cudaEvent_t, EventInfo> g_events;

bool non_blocking(cudaStream_t s) {
  const std::lock_guard lock(g_streams_mutex);
  const auto it = g_streams.find(s);
  return it != g_streams.end() && it->second.non_blocking;
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

bool is_allocated(const void* p, size_t bytes) { return allocations().covers(p, bytes); }

int stream_device(cudaStream_t s) {
  if (s == nullptr) return current_device();
  const std::lock_guard lock(g_streams_mutex);
  const auto it = g_streams.find(s);
  return it == g_streams.end() ? -1 : it->second.device;
}

bool device_failed() { return t_error.sticky; }

bool launchable(cudaStream_t stream, const char* what) {
  const int device = stream_device(stream);
  if (device == current_device()) return true;
  set_error(cudaErrorInvalidResourceHandle,
            std::string(what) + ": launched into " +
                (device < 0 ? std::string("a stream the emulation does not know (destroyed?)")
                            : "a stream of device " + std::to_string(device)) +
                " while device " + std::to_string(current_device()) +
                " is current on this host thread (a GPU refuses it: invalid resource handle)",
            false);
  return false;
}

// ---- stream capture -----------------------------------------------------------------------
namespace {

using Ops = std::vector<std::function<void()>>;

// The capture this host thread runs (cudaStreamCaptureModeThreadLocal, as step_graph.cpp
// asks): what is queued on the captured stream, or on a stream that joined the capture by
// waiting for an event recorded in it, is recorded in issue order (one valid order of the
// graph's nodes); what a GPU refuses during a capture (a synchronisation with a captured
// stream, the legacy default stream, an allocation) invalidates it, and the call returns the
// GPU's error. A joined stream must rejoin: its last node must be waited for by another
// captured stream before the capture ends (cudaErrorStreamCaptureUnjoined otherwise).
struct Member {
  uint64_t last = 0;    // its last node (a join counts as one)
  uint64_t joined = 0;  // its last node another captured stream waited for
};
struct CaptureState {
  bool active = false, invalidated = false;
  uint64_t id = 0;
  cudaStream_t stream = nullptr;  // the origin
  std::map<cudaStream_t, Member> members;
  uint64_t nodes = 0;
  Ops ops;
  Member* member(cudaStream_t s) {
    const auto it = members.find(s);
    return !active || it == members.end() ? nullptr : &it->second;
  }
};
thread_local CaptureState t_capture;
std::atomic<uint64_t> g_captures{0};

cudaError_t invalidate_capture(cudaError_t code, const std::string& what) {
  t_capture.invalidated = true;
  set_error(code, what + " during a stream capture (not allowed on a GPU; the capture is invalidated)", false);
  return code;
}

// Refuses what examines an event last recorded in a capture.
cudaError_t captured_event(const char* call) {
  set_error(cudaErrorCapturedEvent,
            std::string(call) + " of an event last recorded in a capturing stream (not permitted on a GPU)", false);
  return cudaErrorCapturedEvent;
}

}  // namespace

bool allowed_outside_capture(const char* what) {
  if (!t_capture.active) return true;
  invalidate_capture(cudaErrorStreamCaptureUnsupported, what);
  return false;
}

bool capture(cudaStream_t stream, const std::function<void()>& op, const char* what) {
  if (!t_capture.active) return false;
  if (Member* m = t_capture.member(stream)) {
    if (!t_capture.invalidated) t_capture.ops.push_back(op);
    m->last = ++t_capture.nodes;
    return true;
  }
  if (stream == nullptr && !non_blocking(t_capture.stream)) {
    // The legacy default stream would wait for the (blocking) captured stream.
    invalidate_capture(cudaErrorStreamCaptureImplicit, std::string(what) + " on the legacy default stream");
    return true;
  }
  return false;  // a stream the capture does not include runs its work now
}

// ---- deferred work --------------------------------------------------------------------------
// Work queued on a stream runs when something waits for it, not when it is queued: a
// synchronisation of the stream or the device, an event of it that is waited for (by the
// host or, when the waiting stream's work runs, by another stream), a copy into pageable
// memory, cudaFree. So work on one stream that another stream, or the host, uses without
// waiting for it is seen stale, every time, where a GPU would race. The legacy default
// stream runs its work at once, after the blocking streams' (ours are non-blocking).
// RN_SIM_EAGER=1 runs all work when it is queued (to tell an ordering bug from another).
namespace {

struct Queued {
  std::function<void()> op;
  bool event = false;  // an event's time stamp: no work of its own
};
struct Queue {
  std::deque<Queued> ops;
  uint64_t queued = 0, ran = 0;
};
std::recursive_mutex g_work_mutex;  // taken before g_streams_mutex where both are
std::map<cudaStream_t, Queue> g_queues;

bool eager_mode() {
  static const bool eager = [] {
    const char* v = std::getenv("RN_SIM_EAGER");
    return v && std::string(v) == "1";
  }();
  return eager;
}

}  // namespace

// Runs `s`'s work up to `upto`, and then the event records that follow it: on a GPU an event
// completes, and takes its time, as soon as the work before it is done, whoever waits for it
// and whenever. (Left queued, an event recorded after the last kernel of a step would take
// its time only when the host next drained that stream, after work of other streams that a
// GPU runs concurrently: the end of backward stamped after the all-reduce that followed it.)
void drain(cudaStream_t s, uint64_t upto) {
  const std::lock_guard lock(g_work_mutex);
  for (;;) {
    const auto it = g_queues.find(s);  // found again: an op may drain (and so change) others
    if (it == g_queues.end() || it->second.ops.empty()) return;
    if (it->second.ran >= upto && !it->second.ops.front().event) return;
    const std::function<void()> op = std::move(it->second.ops.front().op);
    it->second.ops.pop_front();
    ++it->second.ran;
    op();
  }
}

void drain_streams(bool blocking_only) {
  const std::lock_guard lock(g_work_mutex);
  std::vector<cudaStream_t> streams;
  for (const auto& [s, q] : g_queues)
    if (!q.ops.empty() && (!blocking_only || !non_blocking(s))) streams.push_back(s);
  for (cudaStream_t s : streams) drain(s, UINT64_MAX);
}

namespace {

uint64_t enqueue(cudaStream_t stream, const std::function<void()>& op, const char* what, bool event) {
  if (capture(stream, op, what)) return 0;
  if (stream == nullptr || eager_mode()) {
    if (stream == nullptr) drain_streams(/*blocking_only=*/true);
    op();
    return 0;
  }
  const std::lock_guard lock(g_work_mutex);
  Queue& q = g_queues[stream];
  q.ops.push_back({op, event});
  return ++q.queued;
}

}  // namespace

uint64_t submit(cudaStream_t stream, const std::function<void()>& op, const char* what) {
  return enqueue(stream, op, what, /*event=*/false);
}

bool ran(cudaStream_t stream, uint64_t position) {
  if (position == 0) return true;
  const std::lock_guard lock(g_work_mutex);
  const auto it = g_queues.find(stream);
  return it == g_queues.end() || it->second.ran >= position;
}

}  // namespace rn::cuda::sim

// ---- the CUDA runtime calls we use, on host memory ---------------------------------------
using rn::cuda::sim::t_error;
using rn::cuda::sim::t_capture;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_error.last;
  if (!t_error.sticky && e != cudaSuccess) {
    t_error.cleared = e;
    t_error.cleared_message = std::move(t_error.message);
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
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaError (emulation)";
  }
}

// The emulation's message for the current error names the kernel and the thread.
const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == t_error.last && !t_error.message.empty()) return t_error.message.c_str();
  if (error != cudaSuccess && error == t_error.cleared && !t_error.cleared_message.empty())
    return t_error.cleared_message.c_str();
  return cudaGetErrorName(error);
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return cudaErrorInvalidValue;
  *p = nullptr;
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaMalloc");
  // 256-byte aligned, as cudaMalloc's are, and exactly `bytes` long for the sanitizer.
  // A failure is also this thread's last error (not sticky), as the runtime's is.
  if (bytes > rn::cuda::sim::kDeviceMemoryBytes || (bytes && posix_memalign(p, 256, bytes) != 0)) {
    *p = nullptr;
    rn::cuda::sim::set_error(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes", false);
    return cudaErrorMemoryAllocation;
  }
  if (*p) rn::cuda::sim::allocations().add(*p, bytes);
  return cudaSuccess;
}

// cudaFree and cudaFreeHost wait for the device: all queued work runs first.
cudaError_t cudaFree(void* p) {
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaFree");
  rn::cuda::sim::drain_streams(/*blocking_only=*/false);
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
  rn::cuda::sim::drain_streams(/*blocking_only=*/false);
  rn::cuda::sim::allocations().remove(p);
  std::free(p);
  return cudaSuccess;
}

// Streams and events are distinct non-null tokens; a stream's work is queued and runs when
// something waits for it (above).
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = reinterpret_cast<cudaStream_t>(new char[1]);
  const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
  rn::cuda::sim::g_streams[*s] = {(flags & cudaStreamNonBlocking) != 0, rn::cuda::sim::current_device()};
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  rn::cuda::sim::drain(s, UINT64_MAX);  // its work still completes, as on a GPU
  {
    const std::lock_guard work(rn::cuda::sim::g_work_mutex);
    rn::cuda::sim::g_queues.erase(s);
  }
  {
    const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
    if (!rn::cuda::sim::g_streams.erase(s)) return cudaErrorInvalidResourceHandle;
  }
  delete[] reinterpret_cast<char*>(s);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  *e = reinterpret_cast<cudaEvent_t>(new char[1]);
  const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
  rn::cuda::sim::EventInfo& info = rn::cuda::sim::g_events[*e];
  info.timing = (flags & cudaEventDisableTiming) == 0;
  info.device = rn::cuda::sim::current_device();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    const std::lock_guard lock(rn::cuda::sim::g_streams_mutex);
    if (!rn::cuda::sim::g_events.erase(e)) return cudaErrorInvalidResourceHandle;
  }
  delete[] reinterpret_cast<char*>(e);
  return cudaSuccess;
}

// In a capture, the event marks the stream's last node (for the waits that join streams);
// otherwise it completes after the stream's work queued so far, and takes the time then.
// (A legacy-stream record completes at once, after the blocking streams' work.)
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  using namespace rn::cuda::sim;
  if (t_error.sticky) return t_error.last;
  const int device = stream_device(s);
  Member* m = t_capture.member(s);
  if (!m && s == nullptr && t_capture.active && !non_blocking(t_capture.stream))
    return invalidate_capture(cudaErrorStreamCaptureImplicit, "cudaEventRecord on the legacy default stream");
  const std::lock_guard work(g_work_mutex);
  uint64_t generation = 0;
  {
    const std::lock_guard lock(g_streams_mutex);
    const auto it = g_events.find(e);
    if (it == g_events.end() || device < 0) {
      set_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: an event or stream the emulation does not know",
                false);
      return cudaErrorInvalidResourceHandle;
    }
    EventInfo& ev = it->second;
    if (ev.device != device) {
      set_error(cudaErrorInvalidResourceHandle,
                "cudaEventRecord: an event of device " + std::to_string(ev.device) +
                    " recorded in a stream of device " + std::to_string(device) + " (a GPU refuses it)",
                false);
      return cudaErrorInvalidResourceHandle;
    }
    ev.recorded = true;
    ev.stream = s;
    generation = ++ev.generation;
    if (m) {
      ev.capture = t_capture.id;
      ev.position = m->last;
      return cudaSuccess;
    }
    ev.capture = 0;
    ev.position = 0;
  }
  const auto stamp = [e, generation] {
    const std::lock_guard lock(g_streams_mutex);
    const auto it = g_events.find(e);
    if (it != g_events.end() && it->second.generation == generation) it->second.when_ms = now_ms();
  };
  // On an idle stream the event completes at once (nothing to wait for: the time is now).
  const auto q = g_queues.find(s);
  if (s == nullptr) drain_streams(/*blocking_only=*/true);
  const bool idle = s == nullptr || q == g_queues.end() || q->second.ops.empty();
  const uint64_t position = idle ? (stamp(), 0) : enqueue(s, stamp, "cudaEventRecord", /*event=*/true);
  const std::lock_guard lock(g_streams_mutex);
  const auto it = g_events.find(e);
  if (it != g_events.end() && it->second.generation == generation) it->second.position = position;
  return cudaSuccess;
}

// An event recorded in the running capture: `s` joins the capture if it is not in it (a
// fork), and the event's stream is joined up to the event. Otherwise `s`'s later work waits
// for the event's: when it runs, the event's stream runs up to the event first.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  using namespace rn::cuda::sim;
  if (t_error.sticky) return t_error.last;
  EventInfo ev;
  {
    const std::lock_guard lock(g_streams_mutex);
    const auto it = g_events.find(e);
    if (it == g_events.end() || (s != nullptr && !g_streams.count(s))) {
      set_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: an event or stream the emulation does not know",
                false);
      return cudaErrorInvalidResourceHandle;
    }
    ev = it->second;
  }
  if (ev.capture == 0) {
    // A captured stream may not depend on work recorded outside its capture (the dependency
    // would cross the capture's boundary), whether or not that work is done, unless the wait
    // asks for an external-event node.
    if (ev.recorded && t_capture.member(s) && !(flags & cudaEventWaitExternal))
      return invalidate_capture(cudaErrorStreamCaptureIsolation,
                                "cudaStreamWaitEvent on an event recorded outside the capture");
    if (ran(ev.stream, ev.position)) return cudaSuccess;
    if (t_capture.member(s) || s == nullptr) {
      drain(ev.stream, ev.position);  // work from before the capture: done before any replay
      return cudaSuccess;
    }
    submit(s, [src = ev.stream, upto = ev.position] { drain(src, upto); }, "cudaStreamWaitEvent");
    return cudaSuccess;
  }
  if (!t_capture.active || ev.capture != t_capture.id) return captured_event("cudaStreamWaitEvent outside its capture");
  Member* m = t_capture.member(s);
  if (!m) {
    if (s == nullptr) return invalidate_capture(cudaErrorStreamCaptureImplicit, "the legacy default stream joining");
    m = &t_capture.members[s];
    m->last = ++t_capture.nodes;
  }
  if (ev.stream != s) {
    Member& source = t_capture.members[ev.stream];
    source.joined = std::max(source.joined, ev.position);
  }
  return cudaSuccess;
}

// Runs the event's work (a query finds it done: the GPU was quick); `call` names the caller
// in the refusal of an event recorded in a capture.
static cudaError_t complete_event(cudaEvent_t e, const char* call) {
  using namespace rn::cuda::sim;
  EventInfo ev;
  {
    const std::lock_guard lock(g_streams_mutex);
    const auto it = g_events.find(e);
    if (it == g_events.end()) return cudaErrorInvalidResourceHandle;
    if (it->second.capture) return captured_event(call);
    ev = it->second;
  }
  drain(ev.stream, ev.position);
  return t_error.sticky ? t_error.last : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) { return complete_event(e, "cudaEventQuery"); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return complete_event(e, "cudaEventSynchronize"); }

// The host time between the two events' completions, as a GPU's events time the work
// between them; not ready until both have completed (nothing waits for them here).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  using namespace rn::cuda::sim;
  const std::lock_guard work(g_work_mutex);
  const std::lock_guard lock(g_streams_mutex);
  const auto a = g_events.find(start), b = g_events.find(end);
  if (a == g_events.end() || b == g_events.end()) return cudaErrorInvalidResourceHandle;
  if (a->second.capture || b->second.capture) return captured_event("cudaEventElapsedTime");
  if (!a->second.timing || !b->second.timing || !a->second.recorded || !b->second.recorded ||
      a->second.device != b->second.device) {
    set_error(cudaErrorInvalidResourceHandle,
              "cudaEventElapsedTime: an event made with cudaEventDisableTiming, never recorded, or of another device",
              false);
    return cudaErrorInvalidResourceHandle;
  }
  if (!ran(a->second.stream, a->second.position) || !ran(b->second.stream, b->second.position))
    return cudaErrorNotReady;
  *ms = static_cast<float>(b->second.when_ms - a->second.when_ms);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  using namespace rn::cuda::sim;
  if (t_error.sticky) return t_error.last;
  if (t_capture.member(s) || (s == nullptr && t_capture.active && !non_blocking(t_capture.stream)))
    return invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaStreamQuery of a captured stream");
  if (s == nullptr)
    drain_streams(/*blocking_only=*/true);
  else
    drain(s, UINT64_MAX);
  return t_error.sticky ? t_error.last : cudaSuccess;
}

// The synchronous calls use the legacy default stream: after the blocking streams' work
// (not the non-blocking streams': what they have queued may not have run yet).
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureImplicit, "cudaMemset");
  rn::cuda::sim::drain_streams(/*blocking_only=*/true);
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active) return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureImplicit, "cudaMemcpy");
  rn::cuda::sim::drain_streams(/*blocking_only=*/true);
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

// From pageable host memory the source is read when the call is made (the driver stages it);
// into pageable host memory the call returns when the stream's work and the copy are done;
// any other copy (device or pinned memory on both sides) is the stream's work, reading and
// writing when it runs, so the host must synchronise before it reads what a copy into pinned
// memory brings.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  using namespace rn::cuda::sim;
  if (t_error.sticky) return t_error.last;
  const bool src_pageable = bytes && !allocations().covers(src, bytes);
  if (t_capture.member(s) && bytes && (src_pageable || !allocations().covers(dst, bytes)))
    return invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync to or from pageable host memory");
  if (!src_pageable && bytes && !allocations().covers(dst, bytes) && !t_capture.active) {
    // Into pageable memory a GPU's copy returns once it is done (staged through pinned memory).
    if (s == nullptr)
      drain_streams(/*blocking_only=*/true);
    else
      drain(s, UINT64_MAX);
    std::memmove(dst, src, bytes);
  } else if (src_pageable && !t_capture.active) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                static_cast<const unsigned char*>(src) + bytes);
    submit(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }, "cudaMemcpyAsync");
  } else {
    submit(s, [=] { if (bytes) std::memmove(dst, src, bytes); }, "cudaMemcpyAsync");
  }
  return t_error.last == cudaErrorStreamCaptureImplicit ? cudaGetLastError() : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  rn::cuda::sim::submit(s, [=] { if (bytes) std::memset(p, value, bytes); }, "cudaMemsetAsync");
  return t_error.last == cudaErrorStreamCaptureImplicit ? cudaGetLastError() : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active)
    return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
  rn::cuda::sim::drain_streams(/*blocking_only=*/false);
  return t_error.sticky ? t_error.last : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.member(s) || (t_capture.active && s == nullptr))
    return rn::cuda::sim::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
  if (s == nullptr)
    rn::cuda::sim::drain_streams(/*blocking_only=*/true);
  else
    rn::cuda::sim::drain(s, UINT64_MAX);
  return t_error.sticky ? t_error.last : cudaSuccess;
}

// Graphs: a recording of the captured work, run in order by cudaGraphLaunch.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (t_error.sticky) return t_error.last;
  if (t_capture.active || s == nullptr) return cudaErrorIllegalState;
  t_capture = {};
  t_capture.active = true;
  t_capture.id = ++rn::cuda::sim::g_captures;
  t_capture.stream = s;
  t_capture.members[s] = {};
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!t_capture.active) return cudaErrorIllegalState;
  if (s != t_capture.stream) {
    rn::cuda::sim::set_error(cudaErrorStreamCaptureUnmatched,
                             "cudaStreamEndCapture on a stream that joined the capture, not the one that began it", false);
    return cudaErrorStreamCaptureUnmatched;
  }
  bool invalidated = t_capture.invalidated;
  size_t unjoined = 0;
  for (const auto& [stream, m] : t_capture.members) unjoined += stream != s && m.last > m.joined;
  auto* ops = new rn::cuda::sim::Ops(std::move(t_capture.ops));
  t_capture = {};
  if (invalidated) {
    delete ops;
    return cudaErrorStreamCaptureInvalidated;
  }
  if (unjoined) {
    delete ops;
    rn::cuda::sim::set_error(cudaErrorStreamCaptureUnjoined,
                             std::to_string(unjoined) +
                                 " stream(s) joined the capture and were not joined back: their last work is waited "
                                 "for by no captured stream (a GPU ends the capture with this error)",
                             false);
    return cudaErrorStreamCaptureUnjoined;
  }
  *graph = reinterpret_cast<cudaGraph_t>(ops);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = !t_capture.member(s)   ? cudaStreamCaptureStatusNone
            : t_capture.invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// An executable graph is shared with its queued launches: destroyed while one is in flight,
// it is freed when that launch has run, as on a GPU.
using GraphExec = std::shared_ptr<const rn::cuda::sim::Ops>;

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new GraphExec(std::make_shared<const rn::cuda::sim::Ops>(*reinterpret_cast<rn::cuda::sim::Ops*>(graph))));
  return cudaSuccess;
}

// The replay is the stream's work: the graph's nodes in order, stopping at a fault.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (t_error.sticky) return t_error.last;
  if (!exec) return cudaErrorInvalidValue;
  rn::cuda::sim::submit(
      s,
      [ops = *reinterpret_cast<GraphExec*>(exec)] {
        for (const auto& op : *ops) {
          op();
          if (rn::cuda::sim::device_failed()) return;
        }
      },
      "cudaGraphLaunch");
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<rn::cuda::sim::Ops*>(graph);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<GraphExec*>(exec);
  return cudaSuccess;
}

}  // extern "C"

// Named ranges for NVIDIA's profilers. Under Nsight Systems (`nsys profile --trace=cuda,nvtx`)
// every plan step ("fwd layer1.0.conv1", "bwd_data fc", "cast weights"), the trainer's phases
// ("waiting for a batch", "forward", "optimizer", ...) and each batch a loader worker fills
// appear by name on the timeline, on the thread that ran them, beside the kernels they
// launched. NVTX v3 is header-only and loads nothing unless a tool asks for it through
// NVTX_INJECTION64_PATH (nsys sets it): without one each call is an indirect call to a no-op.
// Built without the NVTX headers (no CUDA toolkit found) every function here does nothing.
#pragma once

namespace rn::nvtx {

// Whether this build carries NVTX (the CUDA toolkit's nvtx3 headers were found).
bool compiled_in();

// A range on the calling thread; pop() ends the innermost one the thread pushed.
void push(const char* name);
void pop();

class Scope {
 public:
  explicit Scope(const char* name) { push(name); }
  ~Scope() { pop(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// The process's current phase, one at a time whichever thread sets it: ends the range of
// the phase before and starts one named `what`.
void phase(const char* what);

// Names the calling thread on the timeline ("train loader worker 0").
void name_this_thread(const char* name);

}  // namespace rn::nvtx

// What this process is doing, for the failure messages of a data-parallel job: the trainer
// names each phase ("forward", "backward", "loading a batch", ...) with the step, and the
// communicator's heartbeat carries it to rank 0, which names the rank that stopped and what
// it was doing. Setting it is two relaxed atomic stores, and it ends one NVTX range and starts
// the next (core/nvtx.h: the phases on a profiler's timeline).
#pragma once

#include <cstdint>

namespace rn {

struct Activity {
  const char* what = "starting";
  int64_t step = -1;     // optimizer steps done when the phase began; -1: none yet
  double seconds = 0;    // how long ago the phase began
};

// `what` must outlive the process (a string literal).
void set_activity(const char* what, int64_t step);
void set_activity(const char* what);  // keeps the step
Activity current_activity();

}  // namespace rn

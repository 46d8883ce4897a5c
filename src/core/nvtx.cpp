#include "core/nvtx.h"

#ifdef RN_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>

#include <mutex>
#endif

namespace rn::nvtx {

#ifdef RN_HAVE_NVTX

bool compiled_in() { return true; }

void push(const char* name) { nvtxRangePushA(name); }

void pop() { nvtxRangePop(); }

void phase(const char* what) {
  static std::mutex mu;
  static nvtxRangeId_t current = 0;  // 0: none (also what every call returns without a tool)
  std::lock_guard<std::mutex> lock(mu);
  if (current != 0) nvtxRangeEnd(current);
  current = nvtxRangeStartA(what);
}

void name_this_thread(const char* name) { nvtxNameOsThreadA(static_cast<uint32_t>(gettid()), name); }

#else

bool compiled_in() { return false; }
void push(const char*) {}
void pop() {}
void phase(const char*) {}
void name_this_thread(const char*) {}

#endif

}  // namespace rn::nvtx

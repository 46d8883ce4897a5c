// What the NVTX ranges (core/nvtx.h) cost when no profiler listens, as in every normal run:
// one push and pop per plan step (about 500 per ResNet-50 training step), one phase per
// trainer phase.
#include <benchmark/benchmark.h>

#include "core/nvtx.h"
#include "micro.h"

namespace rn {

void register_nvtx() {
  benchmark::RegisterBenchmark("Nvtx/PushPop", [](benchmark::State& state) {
    for (auto _ : state) {
      nvtx::push("fwd layer1.0.conv1");
      nvtx::pop();
    }
    state.SetLabel(nvtx::compiled_in() ? "nvtx" : "built without nvtx");
  });
  benchmark::RegisterBenchmark("Nvtx/Phase", [](benchmark::State& state) {
    for (auto _ : state) nvtx::phase("forward");
    state.SetLabel(nvtx::compiled_in() ? "nvtx" : "built without nvtx");
  });
}

}  // namespace rn

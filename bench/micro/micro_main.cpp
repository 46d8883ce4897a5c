// rn_micro: Google Benchmark's main with our families registered (micro.h).
#include <benchmark/benchmark.h>

#include "micro.h"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  rn::register_batch_norm();
  rn::register_conv();
  rn::register_nvtx();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

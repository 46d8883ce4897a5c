// `resnet bench --data PATH`: the input pipeline alone, in images/s and images/s per worker.
#pragma once

#include <cstdint>
#include <string>

namespace rn::cli {

struct DataBenchArgs {
  std::string path;  // image folder or packed shards
  int workers = 0;   // 0: one per host thread
  int64_t batch = 256;
  int height = 224, width = 224;
  int64_t batches = 0;     // timed batches; 0: one epoch
  int warmup = 2;          // untimed batches first
  bool eval = false;       // resize + centre crop instead of RandomResizedCrop + flip
  bool normalize = false;  // f32 NCHW output (the CPU training path) instead of u8 NHWC
  bool dct_scaling = true;
  int64_t cache_mb = 0;
  int epochs = 1;     // > 1 with a cache: later epochs read the cache
  std::string trace;  // Chrome trace output path
  bool json = false;
};

int run_data_bench(const DataBenchArgs& a);

}  // namespace rn::cli

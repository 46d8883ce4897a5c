// The input-pipeline analyser: where the time of loading a batch goes (read, decode,
// augment, collate on the loader's workers; host-to-device copy and data wait on the
// training thread), as shares, with a plain verdict: input-bound or compute-bound, and by
// how much.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace rn {

// Worker seconds per stage, summed over the samples of some batches.
struct PipelineTimes {
  double read = 0;     // file or shard bytes (or a dataset's load for in-memory sets)
  double decode = 0;   // JPEG/PNG decode
  double augment = 0;  // crop, resize, flip (and normalise, for the small-image transforms)
  double collate = 0;  // normalise and cast the uint8 batch to the compute dtype
  int64_t samples = 0;
  int64_t batches = 0;
  int64_t cache_hits = 0;
  int64_t skipped = 0;  // bad files replaced by another sample

  void add(const PipelineTimes& o);
  void subtract(const PipelineTimes& o);  // what came after an earlier snapshot `o`
  double busy() const { return read + decode + augment + collate; }
};

// One epoch (or any span) as the trainer saw it.
struct PipelineSpan {
  PipelineTimes loader;
  int workers = 0;     // loader threads (0: loaded on the training thread)
  double wall = 0;     // seconds of the span
  double wait = 0;     // the training thread waiting for batches
  double copy = 0;     // host-to-device copy (or, on CPU, into the step's input)
  double compute = 0;  // the training step itself
  // What the advice may suggest: the machine's cores and the step's threads (0: unknown), and
  // the decoded-image cache's state.
  int cores = 0;
  int step_threads = 0;
  enum class Cache { off, room, full } cache = Cache::off;
  // The rest of the wall time: the loop's own work between steps (gradient monitor,
  // checkpoints, log lines and records).
  double other() const { return std::max(0.0, wall - wait - copy - compute); }
};

struct PipelineVerdict {
  bool input_bound = false;
  double wait_share = 0;   // wait / wall
  double loader_rate = 0;  // images/s the workers can make at most (busy time, all workers)
  double step_rate = 0;    // images/s the step consumes when never waiting
  double factor = 0;       // input-bound: step_rate / loader_rate; else loader_rate / step_rate
  std::string text;        // one line
};

// The verdict; input-bound when the data-wait share passes `threshold` (the goal: 5%).
PipelineVerdict analyse_pipeline(const PipelineSpan& span, double threshold = 0.05);
// A small table: each stage's seconds per batch and share, then the verdict (without a step,
// as in a loader benchmark, only the loader's stages).
std::string format_pipeline(const PipelineSpan& span, const PipelineVerdict& verdict);
nlohmann::json pipeline_json(const PipelineSpan& span, const PipelineVerdict& verdict);

}  // namespace rn

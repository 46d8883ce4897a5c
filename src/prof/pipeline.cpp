#include "prof/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "core/plural.h"

namespace rn {

void PipelineTimes::add(const PipelineTimes& o) {
  read += o.read;
  decode += o.decode;
  augment += o.augment;
  collate += o.collate;
  samples += o.samples;
  batches += o.batches;
  cache_hits += o.cache_hits;
  skipped += o.skipped;
}

void PipelineTimes::subtract(const PipelineTimes& o) {
  read -= o.read;
  decode -= o.decode;
  augment -= o.augment;
  collate -= o.collate;
  samples -= o.samples;
  batches -= o.batches;
  cache_hits -= o.cache_hits;
  skipped -= o.skipped;
}

PipelineVerdict analyse_pipeline(const PipelineSpan& s, double threshold) {
  PipelineVerdict v;
  const double n = static_cast<double>(s.loader.samples);
  v.wait_share = s.wall > 0 ? s.wait / s.wall : 0;
  const double busy = s.loader.busy();
  v.loader_rate = busy > 0 ? std::max(1, s.workers) * n / busy : 0;
  v.step_rate = s.compute + s.copy > 0 ? n / (s.compute + s.copy) : 0;
  v.input_bound = v.wait_share > threshold;
  if (v.input_bound) {
    v.factor = v.loader_rate > 0 ? v.step_rate / v.loader_rate : 0;
    const std::string waiting = fmt::format("input-bound: {:.1f}% of the time waiting for data; ", 100 * v.wait_share);
    if (s.workers == 0) {
      // The training thread loads every batch itself: the wait is the loading, whatever its speed.
      v.text = waiting + fmt::format(
                             "with data.workers=0 the training thread loads every batch itself ({:.0f} img/s, the "
                             "step takes {:.0f} img/s): set data.workers to load while the step runs",
                             v.loader_rate, v.step_rate);
    } else if (v.factor <= 1) {
      // Fast enough on paper, yet waited for: the rate counts busy time only, so the workers
      // were waiting for a core, or the queue was too short to cover the start or a slow batch.
      v.text = waiting + fmt::format(
                             "the loader's {} could make {:.0f} img/s, {:.2f}x what the step takes ({:.0f} "
                             "img/s), so their speed is not the cause: they are short of cores (data.workers plus "
                             "run.threads above the cores), data.prefetch is too small to cover a slow batch, or the "
                             "span is too short to hide filling the queue",
                             counted(s.workers, "worker"), v.loader_rate,
                             v.step_rate > 0 ? v.loader_rate / v.step_rate : 0, v.step_rate);
    } else {
      // What can make it faster here: more workers only where a core is left for one. The step's
      // threads are busy only while it is not waiting for data.
      std::vector<std::string> ways;
      const double step_busy = std::max(1, s.step_threads) * (1 - v.wait_share);
      const bool cores_left = s.cores <= 0 || s.workers + step_busy <= s.cores - 0.5;
      if (cores_left) ways.emplace_back("more workers");
      ways.emplace_back("packed shards");
      if (s.cache == PipelineSpan::Cache::off) ways.emplace_back("the cache");
      if (s.cache == PipelineSpan::Cache::full) ways.emplace_back("a larger data.cache_mb (the cache is full)");
      const std::string no_workers =
          cores_left
              ? std::string()
              : fmt::format(
                    "; more workers would not help: {} and the step's {} (busy {:.0f}% of the time) already "
                    "take the {} cores",
                    counted(s.workers, "worker"), counted(s.step_threads, "thread"), 100 * (1 - v.wait_share), s.cores);
      v.text = waiting + fmt::format(
                             "the loader makes at most {:.0f} img/s with {}, the step takes {:.0f} img/s, so input "
                             "must get {:.2f}x faster ({}){}",
                             v.loader_rate, counted(s.workers, "worker"), v.step_rate, v.factor, fmt::join(ways, ", "),
                             no_workers);
    }
  } else {
    v.factor = v.step_rate > 0 ? v.loader_rate / v.step_rate : 0;
    v.text = fmt::format(
        "compute-bound: {:.1f}% of the time waiting for data; the loader could make {:.0f} img/s with {}, "
        "{:.2f}x what the step takes ({:.0f} img/s)",
        100 * v.wait_share, v.loader_rate, counted(s.workers, "worker"), v.factor, v.step_rate);
  }
  return v;
}

std::string format_pipeline(const PipelineSpan& s, const PipelineVerdict& v) {
  const double batches = std::max<double>(1, static_cast<double>(s.loader.batches));
  const double busy = std::max(s.loader.busy(), 1e-12);
  std::string out = fmt::format("input pipeline over {} ({}, {}, {} skipped):\n",
                                counted(s.loader.batches, "batch", "batches"), counted(s.loader.samples, "image"),
                                counted(s.loader.cache_hits, "cache hit"), counted(s.loader.skipped, "bad file"));
  auto worker_row = [&](const char* name, double sec) {
    out += fmt::format("  {:<10} {:>9.2f} ms/batch  {:>5.1f}% of loader work\n", name, 1e3 * sec / batches,
                       100 * sec / busy);
  };
  worker_row("read", s.loader.read);
  worker_row("decode", s.loader.decode);
  worker_row("augment", s.loader.augment);
  worker_row("collate", s.loader.collate);
  if (s.compute == 0 && s.copy == 0) return out.substr(0, out.size() - 1);  // the loader alone: no step to compare
  const double wall = std::max(s.wall, 1e-12);
  auto step_row = [&](const char* name, double sec, std::string_view note = "") {
    out += fmt::format("  {:<10} {:>9.2f} ms/batch  {:>5.1f}% of wall time{}\n", name, 1e3 * sec / batches,
                       100 * sec / wall, note);
  };
  step_row("copy", s.copy);
  step_row("wait", s.wait);
  step_row("step", s.compute);
  // What the loop does besides (gradient monitor, checkpoints, log lines and records): in the
  // wall time, so that the rows add up to it and lost throughput has a name.
  step_row("other", s.other(), " (gradient monitor, checkpoints, logging)");
  out += "  verdict: " + v.text;
  return out;
}

nlohmann::json pipeline_json(const PipelineSpan& s, const PipelineVerdict& v) {
  return {{"batches", s.loader.batches},
          {"samples", s.loader.samples},
          {"cache_hits", s.loader.cache_hits},
          {"skipped", s.loader.skipped},
          {"workers", s.workers},
          {"read_s", s.loader.read},
          {"decode_s", s.loader.decode},
          {"augment_s", s.loader.augment},
          {"collate_s", s.loader.collate},
          {"copy_s", s.copy},
          {"wait_s", s.wait},
          {"step_s", s.compute},
          {"other_s", s.other()},
          {"wall_s", s.wall},
          {"wait_share", v.wait_share},
          {"loader_img_s", v.loader_rate},
          {"step_img_s", v.step_rate},
          {"input_bound", v.input_bound},
          {"verdict", v.text}};
}

}  // namespace rn

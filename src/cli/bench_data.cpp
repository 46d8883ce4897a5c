#include "cli/bench_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/format.h"
#include "core/check.h"
#include "core/plural.h"
#include "core/thread_pool.h"
#include "data/augment.h"
#include "data/loader.h"
#include "prof/pipeline.h"
#include "prof/trace.h"
#include "train/data_setup.h"

namespace rn::cli {

int run_data_bench(const DataBenchArgs& a) {
  // Checked before the work: a trace path that cannot be written fails now.
  if (!a.trace.empty()) check_output_path(a.trace, "--trace");
  const int workers = a.workers > 0 ? a.workers : host_threads();
  auto dataset = open_image_dataset(a.path);
  std::shared_ptr<ImageAugment> augment;
  if (a.eval) {
    ResizeCenterCropOptions o;
    o.resize = std::max(a.height, a.width) * 256 / 224;
    o.height = a.height;
    o.width = a.width;
    augment = std::make_shared<ResizeCenterCrop>(o);
  } else {
    RandomResizedCropOptions o;
    o.height = a.height;
    o.width = a.width;
    augment = std::make_shared<RandomResizedCrop>(o);
  }
  augment->dct_scaling = a.dct_scaling;
  DataLoaderOptions lo;
  lo.batch_size = a.batch;
  lo.workers = workers;
  lo.prefetch = std::max(2, workers);
  lo.dtype = a.normalize ? DType::f32 : DType::u8;
  lo.layout = a.normalize ? Layout::nchw : Layout::nhwc;
  lo.cache_bytes = static_cast<size_t>(a.cache_mb) << 20;
  lo.drop_last = true;
  if (!a.trace.empty()) lo.trace = std::make_shared<TraceRecorder>();
  DataLoader loader(dataset, augment, lo);

  // The clock starts when the warm-up batches have been taken. By then the workers have made,
  // or begun, the next `prefetch` batches: taken but not counted (counted, a small folder gave
  // millions of images/s for batches made before the clock started). Every counted batch was
  // begun after it, so the rate errs low, by at most prefetch / counted, never high.
  const int64_t per_epoch = loader.batches_per_epoch();
  const int64_t skipped = a.warmup + lo.prefetch;  // before the first counted batch
  RN_CHECK(per_epoch > skipped) << a.path << " has too few images: " << counted(per_epoch, "batch", "batches") << " of "
                                << a.batch << " per epoch, and the timing needs " << a.warmup << " warm-up, the "
                                << lo.prefetch
                                << " the workers make ahead (not counted: begun before the clock started) and a "
                                   "timed one; lower --batch or --warmup";
  const int64_t available = per_epoch - skipped;
  if (a.batches > available)
    fmt::print(stderr, "note: --batches {}: the epoch has {} after the warm-up and prefetched ones; timing those\n",
               a.batches, counted(available, "batch", "batches"));
  const int64_t timed = a.batches > 0 ? std::min(a.batches, available) : available;
  // The prefetched batches' making is inside the timed span: with few timed batches that is
  // most of it (a folder of 8 batches, 4 prefetched, read at 40% of its rate). Said, with what
  // would time it within 25%.
  if (timed < 4 * lo.prefetch)
    fmt::print(stderr,
               "note: {} timed against {} made ahead uncounted: the rate may read up to {:.0f}% low; {} images or "
               "more (or a smaller --batch) time it within 25%\n",
               counted(timed, "batch is", "batches are"), lo.prefetch,
               100.0 * static_cast<double>(lo.prefetch) / static_cast<double>(timed + lo.prefetch),
               (skipped + 4 * lo.prefetch) * a.batch);
  int64_t images = 0, seen = 0;
  double seconds = 0;
  PipelineTimes times;
  using Clock = std::chrono::steady_clock;
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    // Only the last epoch is timed (earlier ones fill the cache); warmup batches are not.
    const bool timed_epoch = epoch == a.epochs - 1;
    loader.start_epoch(epoch);
    int64_t k = 0;
    Clock::time_point t0 = Clock::now();
    PipelineTimes before = loader.epoch_times();
    while (const Batch* b = loader.next()) {
      ++k;
      if (!timed_epoch) continue;
      if (k == a.warmup) t0 = Clock::now();
      // The stage times cover the counted batches only, as the image count does.
      if (k == skipped) before = loader.epoch_times();
      if (k > skipped) {
        images += b->size;
        ++seen;
      }
      if (seen >= timed) break;
    }
    if (timed_epoch) {
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      times = loader.epoch_times();
      times.subtract(before);
    }
  }
  const double rate = images / seconds;
  if (!a.trace.empty()) lo.trace->write(a.trace);
  if (a.json) {
    // Neither the warm-up batches (before the clock) nor the uncounted ones (prefetched: taken in
    // the timed window, begun before it) are in "images".
    fmt::print(
        "{{\"system\":\"resnet.cpp\",\"path\":{},\"workers\":{},\"batch\":{},\"images\":{},\"seconds\":{:.4f},"
        "\"images_per_sec\":{:.2f},\"images_per_sec_per_worker\":{:.2f},\"warmup_batches\":{},\"uncounted_batches\":{},"
        "\"eval\":{},\"cache_"
        "hits\":{},"
        "\"read_s\":{:.4f},\"decode_s\":{:.4f},\"augment_s\":{:.4f},\"collate_s\":{:.4f}}}\n",
        nlohmann::json(a.path).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), workers, a.batch, images,
        seconds, rate, rate / workers, a.warmup, lo.prefetch, a.eval, times.cache_hits, times.read, times.decode,
        times.augment, times.collate);
    return 0;
  }
  fmt::print(
      "{} | {} | {} | batch {} | {} | {} images in {:.2f} s | {:.1f} img/s | {:.1f} img/s per worker (after {} "
      "warm-up and {} prefetched batches, not counted)\n",
      dataset->name(), augment->name(), counted(workers, "worker"), a.batch, a.normalize ? "f32 NCHW" : "u8 NHWC",
      images, seconds, rate, rate / workers, a.warmup, lo.prefetch);
  PipelineSpan span;
  span.loader = times;
  span.workers = workers;
  span.wall = seconds;
  span.wait = seconds;  // nothing else runs: the consumer only waits
  fmt::print("{}\n", format_pipeline(span, analyse_pipeline(span)));
  return 0;
}

}  // namespace rn::cli

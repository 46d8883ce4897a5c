#include "data/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>

#include "core/check.h"
#include "core/log.h"
#include "core/nvtx.h"

namespace rn {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const ImageTransform> transform,
                       const DataLoaderOptions& options)
    : dataset_(std::move(dataset)), transform_(std::move(transform)), options_(options) {
  RN_CHECK(dataset_ != nullptr) << "DataLoader needs a dataset";
  RN_CHECK(transform_ != nullptr) << "DataLoader needs a transform";
  RN_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16 ||
           (options.dtype == DType::u8 && options.defer_crop_flip))
      << "batch dtype " << dtype_name(options.dtype)
      << ": this loader writes f32 or bf16, or u8 with defer_crop_flip (the transform left to the device)";
  RN_CHECK(options.dtype == DType::u8 || !options.defer_crop_flip)
      << "defer_crop_flip leaves normalisation to the device too, so it needs u8 batches, not "
      << dtype_name(options.dtype);
  RN_CHECK(options.dtype != DType::u8 || options.layout == Layout::nhwc)
      << "u8 batches are NHWC, not " << layout_name(options.layout);
  geometry_ = transform_->output_geometry(dataset_->geometry());
  RN_CHECK(geometry_.fixed()) << transform_->name() << " produces " << geometry_.str() << " images, not a fixed size";
  init(dataset_->geometry());
}

DataLoader::DataLoader(std::shared_ptr<const EncodedDataset> dataset, std::shared_ptr<const ImageAugment> augment,
                       const DataLoaderOptions& options)
    : dataset_(dataset), encoded_(std::move(dataset)), augment_(std::move(augment)), options_(options) {
  RN_CHECK(encoded_ != nullptr) << "DataLoader needs a dataset";
  RN_CHECK(augment_ != nullptr) << "DataLoader needs an augmentation";
  RN_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16 || options.dtype == DType::u8)
      << "batch dtype " << dtype_name(options.dtype) << ": the loader writes u8, f32 or bf16";
  RN_CHECK(options.dtype != DType::u8 || options.layout == Layout::nhwc)
      << "u8 batches are RGB NHWC, not " << layout_name(options.layout);
  RN_CHECK(options.dtype == DType::u8 || !options.defer_crop_flip)
      << "defer_crop_flip leaves normalisation to the device too, so it needs u8 batches, not "
      << dtype_name(options.dtype);
  geometry_ = SampleGeometry{3, augment_->out_height(), augment_->out_width()};
  if (options.dtype != DType::u8) normalizer_ = std::make_unique<Normalizer>(3, options.mean, options.std);
  if (options.cache_bytes > 0)
    cache_ = std::make_unique<DecodedCache>(encoded_->size(), options.cache_bytes, options.cache_short_side);
  init(encoded_->geometry());
}

void DataLoader::init(const SampleGeometry&) {
  const DataLoaderOptions& options = options_;
  RN_CHECK(options.batch_size >= 1) << "batch_size " << options.batch_size;
  RN_CHECK(options.workers >= 0) << "workers " << options.workers;
  RN_CHECK(options.prefetch >= 1) << "prefetch " << options.prefetch;
  int64_t begin = 0, end = 0;
  shard_range(dataset_->size(), options.shard, &begin, &end);
  samples_per_epoch_ = end - begin;
  const int64_t bs = options.batch_size;
  batches_per_epoch_ = options.drop_last ? samples_per_epoch_ / bs : (samples_per_epoch_ + bs - 1) / bs;
  RN_CHECK(batches_per_epoch_ >= 1) << dataset_->name() << " has "
                                    << (options.shard.world_size > 1
                                            ? fmt::format("{} samples per epoch for rank {} of {}", samples_per_epoch_,
                                                          options.shard.rank, options.shard.world_size)
                                            : fmt::format("{} samples", samples_per_epoch_))
                                    << ", fewer than one batch of " << bs
                                    << (options.shard.world_size > 1 && samples_per_epoch_ == 0
                                            ? fmt::format(": it has {} in all, fewer than the {} ranks; give it more",
                                                          dataset_->size(), options.shard.world_size)
                                            : ": lower the batch size (data.batch_size; --batch for resnet bench)");

  // One slot more than the prefetch depth: the consumer holds one batch while the workers
  // fill `prefetch` others.
  const size_t image_bytes = static_cast<size_t>(bs * geometry_.pixels()) * dtype_size(options.dtype);
  MemorySpace& memory = options.batch_memory ? *options.batch_memory : host_memory();
  RN_CHECK(memory.device() == Device::cpu) << "batch_memory must be host memory the loader's threads can write";
  slots_.resize(static_cast<size_t>(options.prefetch) + 1);
  for (Slot& slot : slots_) {
    slot.image_buffer = DeviceBuffer(memory, image_bytes);
    slot.label_buffer = DeviceBuffer(memory, static_cast<size_t>(bs) * sizeof(int32_t));
    if (options.defer_crop_flip) slot.crop_buffer = DeviceBuffer(memory, static_cast<size_t>(bs) * 3 * sizeof(int32_t));
    if (encoded_ && options.dtype != DType::u8)
      slot.raw_buffer = HostBuffer(static_cast<size_t>(bs * geometry_.pixels()));
    slot.indices.reserve(static_cast<size_t>(bs));
  }
  workers_.reserve(static_cast<size_t>(options.workers));
  for (int i = 0; i < options.workers; ++i) {
    try {
      workers_.emplace_back([this, i] {
        const std::string name = options_.name + " worker " + std::to_string(i);
        nvtx::name_this_thread(name.c_str());
        if (options_.trace) options_.trace->name_thread(name);
        worker_loop();
      });
    } catch (const std::system_error& e) {
      // The threads already started are joined before the error leaves (a joinable thread
      // destroyed would end the process without a word).
      stop_workers();
      RN_FAIL() << "cannot start worker thread " << i + 1 << " of " << options.workers << " for the " << options_.name
                << " (" << e.what() << "): the system's thread or memory limit (ulimit -u, -v) is reached; lower "
                << "data.workers";
    }
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  RN_CHECK(epoch >= 0) << "epoch " << epoch;
  RN_CHECK(skip_batches >= 0 && skip_batches <= batches_per_epoch_)
      << "cannot skip " << skip_batches << " batches of an epoch of " << batches_per_epoch_;
  std::vector<int64_t> order = epoch_indices(dataset_->size(), options_.seed, epoch, options_.shuffle, options_.shard);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = generation_ + 1;
    order_ = std::move(order);
    epoch_ = epoch;
    next_claim_ = skip_batches;
    next_deliver_ = skip_batches;
    started_ = true;
    held_ = -1;
    // Batches of the old epoch that are done are dropped now; those still being filled are
    // dropped by their worker when it sees the generation change.
    for (Slot& slot : slots_) {
      if (slot.state == SlotState::ready || slot.state == SlotState::held) slot.state = SlotState::free;
    }
  }
  epoch_wait_seconds_ = 0;
  epoch_times_ = PipelineTimes{};
  work_cv_.notify_all();
}

bool DataLoader::can_claim() const {
  return started_ && next_claim_ < batches_per_epoch_ &&
         slots_[static_cast<size_t>(next_claim_) % slots_.size()].state == SlotState::free;
}

DataLoader::Slot& DataLoader::claim(uint64_t* generation) {
  const int64_t k = next_claim_++;
  Slot& slot = slots_[static_cast<size_t>(k) % slots_.size()];
  const int64_t bs = options_.batch_size;
  slot.state = SlotState::filling;
  slot.generation = generation_;
  slot.batch = k;
  slot.epoch = epoch_;
  slot.count = std::min(bs, samples_per_epoch_ - k * bs);
  slot.error = nullptr;
  slot.times = PipelineTimes{};
  slot.indices.assign(order_.begin() + k * bs, order_.begin() + k * bs + slot.count);
  slot.replaced.assign(static_cast<size_t>(slot.count), 0);
  *generation = slot.generation;
  return slot;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point& t) {
  const Clock::time_point now = Clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

}  // namespace

void DataLoader::fill(Slot& slot, WorkerState& state) {
  const double start_us = options_.trace ? trace_now_us() : 0;
  Tensor images;
  images.data = slot.image_buffer.data();
  images.shape = Shape{slot.count, geometry_.channels, geometry_.height, geometry_.width};
  images.dtype = options_.dtype;
  images.layout = options_.layout;
  if (encoded_) {
    fill_encoded(slot, state, images);
  } else {
    int32_t* labels = static_cast<int32_t*>(slot.label_buffer.data());
    const int num_classes = dataset_->num_classes();
    int64_t i = 0;
    try {
      Clock::time_point t = Clock::now();
      for (; i < slot.count; ++i) {
        if (stopping_.load(std::memory_order_relaxed) ||
            generation_.load(std::memory_order_relaxed) != slot.generation) {
          return;  // shutting down, or the epoch was restarted: this batch will be thrown away
        }
        const int64_t index = slot.indices[static_cast<size_t>(i)];
        dataset_->load(index, state.sample);
        slot.times.read += seconds_since(t);
        RN_CHECK(state.sample.label >= 0 && state.sample.label < num_classes)
            << "label " << state.sample.label << " outside [0, " << num_classes << ")";
        Rng rng = sample_rng(options_.seed, slot.epoch, index);
        if (options_.defer_crop_flip)
          transform_->apply_deferred(state.sample, rng, images, i, crop_of(slot, i));
        else
          transform_->apply(state.sample, rng, images, i, state.scratch);
        labels[i] = state.sample.label;
        slot.times.augment += seconds_since(t);
      }
    } catch (const std::exception& e) {
      const int64_t index = slot.indices[static_cast<size_t>(i)];
      // Epochs and batches counted from 1, as the trainer's log counts them.
      slot.error = std::make_exception_ptr(Error("loading sample " + std::to_string(index) + " of " + dataset_->name() +
                                                 " (epoch " + std::to_string(slot.epoch + 1) + ", batch " +
                                                 std::to_string(slot.batch + 1) + "): " + e.what()));
    }
  }
  slot.times.samples = slot.count;
  slot.times.batches = 1;
  if (options_.trace && !slot.error) {
    const PipelineTimes& t = slot.times;
    // Counted from 1, as the trainer's log counts epochs and batches (its step spans are global).
    options_.trace->complete(fmt::format("load batch {} of epoch {}", slot.batch + 1, slot.epoch + 1), "data", start_us,
                             trace_now_us() - start_us,
                             {{"epoch", static_cast<double>(slot.epoch + 1)},
                              {"batch", static_cast<double>(slot.batch + 1)},
                              {"read_ms", 1e3 * t.read},
                              {"decode_ms", 1e3 * t.decode},
                              {"augment_ms", 1e3 * t.augment},
                              {"collate_ms", 1e3 * t.collate},
                              {"images", static_cast<double>(slot.count)}});
  }
}

void DataLoader::mark_bad(int64_t index, const std::string& message) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(bad_mu_);
    first = bad_.insert(index).second;
  }
  if (first) RN_LOG_WARN("skipping bad image (sample {}, replaced by the next readable one): {}", index, message);
}

int64_t DataLoader::bad_file_count() const {
  std::lock_guard<std::mutex> lock(bad_mu_);
  return static_cast<int64_t>(bad_.size());
}

int32_t* DataLoader::crop_of(Slot& slot, int64_t i) {
  return static_cast<int32_t*>(slot.crop_buffer.data()) + 3 * i;
}

namespace {
// Device augmentation: the flip is recorded for the device instead of rendered.
void defer_flip(CropPlan& plan, int32_t* crop) {
  if (!crop) return;
  crop[0] = crop[1] = 0;
  crop[2] = plan.flip ? 1 : 0;
  plan.flip = false;
}
}  // namespace

int DataLoader::load_encoded(int64_t index, Rng& rng, uint8_t* out, int32_t* crop, WorkerState& st,
                             PipelineTimes& times) const {
  Clock::time_point t = Clock::now();
  const size_t out_stride = static_cast<size_t>(geometry_.width) * 3;
  try {
    if (cache_) {
      const CachedImage* image = cache_->find(index);
      if (image) {
        ++times.cache_hits;
      } else {
        // Miss: decode at the cache's resolution (shorter side at most short_side), keep
        // it if there is room, and augment from it either way, so that a later hit gives
        // exactly these pixels.
        CachedImage& fresh = st.fresh;
        fresh.label = encoded_->read(index, st.encoded);
        times.read += seconds_since(t);
        decode_fitted(st.encoded, cache_->short_side(), st.augment, fresh.pixels, &fresh.width, &fresh.height);
        times.decode += seconds_since(t);
        image = cache_->insert(index, fresh);
        if (!image) image = &fresh;
      }
      CropPlan plan = augment_->plan(image->width, image->height, rng);
      defer_flip(plan, crop);
      const DecodeRequest& r = plan.request;
      resize_bilinear_aa(ImageView{image->pixels.data(), image->width, image->height, 3, 0},
                         ResizeBox{float(r.x), float(r.y), float(r.x + r.width), float(r.y + r.height)}, plan.window,
                         out, out_stride, plan.flip, st.augment.resize);
      times.augment += seconds_since(t);
      return image->label;
    }
    const int label = encoded_->read(index, st.encoded);
    times.read += seconds_since(t);
    const ImageInfo info = image_info(st.encoded);
    CropPlan plan = augment_->plan(info.width, info.height, rng);
    defer_flip(plan, crop);
    decode_image(st.encoded, plan.request, st.augment.decoded);
    times.decode += seconds_since(t);
    render(st.augment.decoded, plan, out, out_stride, st.augment.resize);
    times.augment += seconds_since(t);
    return label;
  } catch (const Error& e) {
    // Named once: the dataset's own read errors already start with the sample's source.
    const std::string source = encoded_->source(index), what = e.what();
    throw Error(what.starts_with(source + ":") ? what : source + ": " + what);
  }
}

void DataLoader::fill_encoded(Slot& slot, WorkerState& state, const Tensor& images) {
  int32_t* labels = static_cast<int32_t*>(slot.label_buffer.data());
  const int num_classes = encoded_->num_classes();
  const bool u8 = options_.dtype == DType::u8;
  uint8_t* raw = static_cast<uint8_t*>(u8 ? slot.image_buffer.data() : slot.raw_buffer.data());
  const size_t image_bytes = static_cast<size_t>(geometry_.pixels());
  const int64_t n = encoded_->size();
  int64_t i = 0;
  try {
    for (; i < slot.count; ++i) {
      if (stopping_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_relaxed) != slot.generation)
        return;
      // A bad file is replaced by the next readable sample of the dataset (the same one
      // whichever worker meets it), with that sample's own augmentation stream.
      // Each bad sample of the epoch counts once, however many bad neighbours it skips.
      int64_t index = slot.indices[static_cast<size_t>(i)];
      bool replaced = false;
      auto replace = [&] {
        if (!replaced) ++slot.times.skipped;
        replaced = true;
        slot.replaced[static_cast<size_t>(i)] = 1;
        index = (index + 1) % n;
      };
      for (int64_t tries = 0;; ++tries) {
        RN_CHECK(tries < n) << "no readable image in " << encoded_->name();
        // A file that failed before is read again: whether a damaged JPEG decodes can depend on
        // the crop (only its rows are decoded), and a batch must be a function of the seed, the
        // epoch and the sample alone, or a resumed run (which has not met the failure) would
        // take other batches than an uninterrupted one.
        Rng rng = sample_rng(options_.seed, slot.epoch, index);
        try {
          const int label = load_encoded(index, rng, raw + image_bytes * static_cast<size_t>(i),
                                         options_.defer_crop_flip ? crop_of(slot, i) : nullptr, state, slot.times);
          RN_CHECK(label >= 0 && label < num_classes)
              << encoded_->source(index) << ": label " << label << " outside [0, " << num_classes << ")";
          labels[i] = label;
          break;
        } catch (const std::exception& e) {
          // Any failure of one file is that file's (a size from a damaged header that cannot be
          // allocated, a file that became a folder), and named as such.
          const bool ours = dynamic_cast<const Error*>(&e) != nullptr;
          const std::string what = ours ? e.what() : encoded_->source(index) + ": " + e.what();
          if (options_.bad_files == BadFilePolicy::error) {
            if (ours) throw;
            throw Error(what);
          }
          mark_bad(index, what);
          replace();
        }
      }
    }
    if (!u8) {
      Clock::time_point t = Clock::now();
      normalizer_->apply(raw, slot.count, images);
      slot.times.collate += seconds_since(t);
    }
  } catch (const std::exception& e) {
    slot.error =
        std::make_exception_ptr(Error("loading batch " + std::to_string(slot.batch + 1) + " of epoch " +
                                      std::to_string(slot.epoch + 1) + " from " + encoded_->name() + ": " + e.what()));
  }
}

void DataLoader::finish(Slot& slot, uint64_t generation) {
  if (generation != generation_ || stop_) {
    slot.state = SlotState::free;
    work_cv_.notify_all();
    return;
  }
  slot.state = SlotState::ready;
  ready_cv_.notify_all();
}

void DataLoader::worker_loop() {
  WorkerState state;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || can_claim(); });
    if (stop_) return;
    uint64_t generation = 0;
    Slot& slot = claim(&generation);
    lock.unlock();
    {
      nvtx::Scope range("load batch");
      fill(slot, state);
    }
    lock.lock();
    finish(slot, generation);
  }
}

const Batch* DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  RN_CHECK(started_) << "DataLoader::next() called before start_epoch()";
  if (held_ >= 0) {
    slots_[static_cast<size_t>(held_)].state = SlotState::free;
    held_ = -1;
    work_cv_.notify_all();
  }
  if (next_deliver_ >= batches_per_epoch_) return nullptr;

  const int64_t k = next_deliver_;
  const size_t s = static_cast<size_t>(k) % slots_.size();
  Slot& slot = slots_[s];
  const auto t0 = std::chrono::steady_clock::now();
  if (workers_.empty()) {
    uint64_t generation = 0;
    claim(&generation);
    lock.unlock();
    fill(slot, inline_state_);
    lock.lock();
    finish(slot, generation);
  } else {
    ready_cv_.wait(lock,
                   [&] { return slot.state == SlotState::ready && slot.generation == generation_ && slot.batch == k; });
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  epoch_wait_seconds_ += waited;
  total_wait_seconds_ += waited;
  epoch_times_.add(slot.times);
  total_times_.add(slot.times);
  ++next_deliver_;

  if (slot.error) {
    std::exception_ptr error = slot.error;
    slot.error = nullptr;
    slot.state = SlotState::free;
    work_cv_.notify_all();
    std::rethrow_exception(error);
  }
  slot.state = SlotState::held;
  held_ = static_cast<int>(s);
  Batch& b = slot.view;
  b.images.data = slot.image_buffer.data();
  b.images.shape = Shape{slot.count, geometry_.channels, geometry_.height, geometry_.width};
  b.images.dtype = options_.dtype;
  b.images.layout = options_.layout;
  b.labels.data = slot.label_buffer.data();
  b.labels.shape = Shape{slot.count};
  b.labels.dtype = DType::i32;
  if (options_.defer_crop_flip) {
    b.crops.data = slot.crop_buffer.data();
    b.crops.shape = Shape{slot.count, 3};
    b.crops.dtype = DType::i32;
  }
  b.size = slot.count;
  b.index = slot.batch;
  b.epoch = slot.epoch;
  b.sample_indices = std::span<const int64_t>(slot.indices.data(), slot.indices.size());
  b.replaced = std::span<const uint8_t>(slot.replaced.data(), slot.replaced.size());
  return &b;
}

}  // namespace rn

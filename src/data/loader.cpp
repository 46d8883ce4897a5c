#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/check.h"

namespace rn {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const ImageTransform> transform,
                       const DataLoaderOptions& options)
    : dataset_(std::move(dataset)), transform_(std::move(transform)), options_(options) {
  RN_CHECK(dataset_ != nullptr) << "DataLoader needs a dataset";
  RN_CHECK(transform_ != nullptr) << "DataLoader needs a transform";
  RN_CHECK(options.batch_size >= 1) << "batch_size " << options.batch_size;
  RN_CHECK(options.workers >= 0) << "workers " << options.workers;
  RN_CHECK(options.prefetch >= 1) << "prefetch " << options.prefetch;
  RN_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16)
      << "batch dtype " << dtype_name(options.dtype) << ": the loader writes f32 or bf16";
  geometry_ = transform_->output_geometry(dataset_->geometry());
  RN_CHECK(geometry_.fixed()) << transform_->name() << " produces " << geometry_.str() << " images, not a fixed size";

  int64_t begin = 0, end = 0;
  shard_range(dataset_->size(), options.shard, &begin, &end);
  samples_per_epoch_ = end - begin;
  const int64_t bs = options.batch_size;
  batches_per_epoch_ = options.drop_last ? samples_per_epoch_ / bs : (samples_per_epoch_ + bs - 1) / bs;
  RN_CHECK(batches_per_epoch_ >= 1) << dataset_->name() << " gives rank " << options.shard.rank << " of "
                                    << options.shard.world_size << " " << samples_per_epoch_
                                    << " samples per epoch, not one batch of " << bs
                                    << (options.drop_last ? " (drop_last is on)" : "");

  // One slot more than the prefetch depth: the consumer holds one batch while the workers
  // fill `prefetch` others.
  const size_t image_bytes = static_cast<size_t>(bs * geometry_.pixels()) * dtype_size(options.dtype);
  slots_.resize(static_cast<size_t>(options.prefetch) + 1);
  for (Slot& slot : slots_) {
    slot.image_buffer = HostBuffer(image_bytes);
    slot.label_buffer = HostBuffer(static_cast<size_t>(bs) * sizeof(int32_t));
    slot.indices.reserve(static_cast<size_t>(bs));
  }
  workers_.reserve(static_cast<size_t>(options.workers));
  for (int i = 0; i < options.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

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
  slot.indices.assign(order_.begin() + k * bs, order_.begin() + k * bs + slot.count);
  *generation = slot.generation;
  return slot;
}

void DataLoader::fill(Slot& slot, WorkerState& state) const {
  Tensor images;
  images.data = slot.image_buffer.data();
  images.shape = Shape{slot.count, geometry_.channels, geometry_.height, geometry_.width};
  images.dtype = options_.dtype;
  images.layout = options_.layout;
  int32_t* labels = static_cast<int32_t*>(slot.label_buffer.data());
  const int num_classes = dataset_->num_classes();
  int64_t i = 0;
  try {
    for (; i < slot.count; ++i) {
      if (stopping_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_relaxed) != slot.generation) {
        return;  // shutting down, or the epoch was restarted: this batch will be thrown away
      }
      const int64_t index = slot.indices[static_cast<size_t>(i)];
      dataset_->load(index, state.sample);
      RN_CHECK(state.sample.label >= 0 && state.sample.label < num_classes)
          << "label " << state.sample.label << " outside [0, " << num_classes << ")";
      Rng rng = sample_rng(options_.seed, slot.epoch, index);
      transform_->apply(state.sample, rng, images, i, state.scratch);
      labels[i] = state.sample.label;
    }
  } catch (const std::exception& e) {
    const int64_t index = slot.indices[static_cast<size_t>(i)];
    slot.error = std::make_exception_ptr(Error("loading sample " + std::to_string(index) + " of " + dataset_->name() +
                                               " (epoch " + std::to_string(slot.epoch) + ", batch " +
                                               std::to_string(slot.batch) + "): " + e.what()));
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
    fill(slot, state);
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
  b.size = slot.count;
  b.index = slot.batch;
  b.epoch = slot.epoch;
  b.sample_indices = std::span<const int64_t>(slot.indices.data(), slot.indices.size());
  return &b;
}

}  // namespace rn

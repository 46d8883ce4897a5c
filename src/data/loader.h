// The data loader: worker threads turn dataset samples into batches in reusable buffers,
// at most `prefetch` batches ahead of the consumer, and the consumer receives them in epoch
// order. Which worker made a batch never changes its content: the epoch order comes from
// (seed, epoch), and each sample's augmentation from (seed, epoch, sample index).
//
//   DataLoader loader(dataset, transform, options);
//   loader.start_epoch(epoch);              // or start_epoch(epoch, batches_done) to resume
//   while (const Batch* b = loader.next()) train_step(*b);
//   double wait = loader.epoch_wait_seconds();
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/dtype.h"
#include "core/memory_space.h"
#include "core/tensor.h"
#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/encoded_dataset.h"
#include "data/image_cache.h"
#include "data/normalize.h"
#include "data/sampler.h"
#include "data/transform.h"
#include "prof/pipeline.h"
#include "prof/trace.h"

namespace rn {

// What happens when an image cannot be read or decoded (corrupt, truncated, empty, not an
// image): `skip` replaces it by the next readable sample of the dataset, counts it and logs
// its path once; `error` stops the run with an error naming the file.
enum class BadFilePolicy : uint8_t { skip, error };

struct DataLoaderOptions {
  std::string name = "loader";  // its worker threads are "<name> worker <i>" in traces and profilers
  int64_t batch_size = 128;     // per rank
  int workers = 2;           // loading threads; 0 loads each batch inside next(), on the consumer's thread
  int prefetch = 4;          // batches the workers may have ready or in progress ahead of the consumer
  bool shuffle = true;       // permute each epoch with (seed, epoch); false: dataset order
  bool drop_last = true;     // drop this rank's final partial batch; false keeps it (size < batch_size)
  uint64_t seed = 0;         // shuffle and augmentation
  ShardSpec shard;           // rank, world_size, equal-size slices
  DType dtype = DType::f32;  // batch images: f32 or bf16 (normalised), or u8 (raw pixels, NHWC)
  Layout layout = Layout::nchw;
  // u8 batches only: leave the last, cheap part of the augmentation to the device, where
  // crop_flip_normalize (ops/augment.h) applies it with the normalisation: the flip for
  // encoded images (the loader still does the random resized crop, which resamples), the
  // padded random crop and the flip for small images (the loader copies raw pixels). Each
  // image's (y0, x0, flip) goes into Batch::crops. false: u8 batches come cropped and
  // flipped (encoded datasets only).
  bool defer_crop_flip = false;
  // Where batch buffers are allocated (nullptr: plain host memory). A device backend's
  // pinned memory (Backend::pinned_memory) lets its copies run asynchronously.
  MemorySpace* batch_memory = nullptr;

  // Encoded-image datasets (JPEG/PNG folders, shards) only:
  std::vector<float> mean{0.485f, 0.456f, 0.406f};  // normalisation for f32/bf16 batches, pixels in [0, 1]
  std::vector<float> std{0.229f, 0.224f, 0.225f};
  BadFilePolicy bad_files = BadFilePolicy::skip;
  size_t cache_bytes = 0;      // decoded-image cache capacity; 0: no cache
  int cache_short_side = 256;  // cached images are downscaled to at most this shorter side
  // Records one span per batch (worker, stage times) when set.
  std::shared_ptr<TraceRecorder> trace;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const ImageTransform> transform,
             const DataLoaderOptions& options);
  // Encoded images: the augmentation plans each crop from the header, the decoder decodes
  // only that region, and the batch is written as uint8 RGB NHWC, then normalised into
  // options.dtype unless that is u8.
  DataLoader(std::shared_ptr<const EncodedDataset> dataset, std::shared_ptr<const ImageAugment> augment,
             const DataLoaderOptions& options);
  // Stops the workers and joins them; safe at any point, also with batches in flight.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins `epoch`, abandoning whatever remains of the current one. `skip_batches` resumes
  // mid-epoch: the first batch delivered is batch `skip_batches` of the epoch, identical to
  // the one an uninterrupted run would have delivered there.
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);

  // The next batch of the epoch, or nullptr when the epoch is done. The batch stays valid
  // until the next call to next() or start_epoch(). A worker's error (a bad file, a corrupt
  // sample) is rethrown here as rn::Error; that batch is lost, and later calls go on.
  const Batch* next();

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }  // this rank's samples, before drop_last
  int64_t epoch() const { return epoch_; }
  // Logical [batch_size, C, H, W] of a full batch.
  Shape image_shape() const {
    return Shape{options_.batch_size, geometry_.channels, geometry_.height, geometry_.width};
  }
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // Seconds the consumer spent inside next() waiting for batches since start_epoch (with
  // workers = 0: the time spent loading). Divided by the epoch time, the data-wait share.
  double epoch_wait_seconds() const { return epoch_wait_seconds_; }
  double total_wait_seconds() const { return total_wait_seconds_; }
  // Worker time per stage of the batches delivered since start_epoch, and since construction.
  const PipelineTimes& epoch_times() const { return epoch_times_; }
  const PipelineTimes& total_times() const { return total_times_; }
  int workers() const { return options_.workers; }

  // Distinct bad files met so far (skip policy), and the decoded-image cache (nullptr: off).
  int64_t bad_file_count() const;
  const DecodedCache* cache() const { return cache_.get(); }

 private:
  enum class SlotState { free, filling, ready, held };
  struct Slot {
    DeviceBuffer image_buffer;  // in options.batch_memory
    DeviceBuffer label_buffer;
    DeviceBuffer crop_buffer;  // i32 [batch, 3] with defer_crop_flip
    std::vector<int64_t> indices;  // dataset indices of the batch in progress
    std::vector<uint8_t> replaced;  // per index: unreadable, another sample stands in (Batch::replaced)
    SlotState state = SlotState::free;
    uint64_t generation = 0;  // start_epoch count when claimed; stale work is thrown away
    int64_t batch = -1;
    int64_t epoch = 0;
    int64_t count = 0;
    std::exception_ptr error;
    PipelineTimes times;
    HostBuffer raw_buffer;  // u8 NHWC staging for encoded datasets when dtype is not u8
    Batch view;
  };
  struct WorkerState {
    Sample sample;
    TransformScratch scratch;
    EncodedImage encoded;
    AugmentScratch augment;
    CachedImage fresh;  // a decode at cache resolution that did not fit into the cache
  };

  bool can_claim() const;
  Slot& claim(uint64_t* generation);  // under mu_: takes batch next_claim_
  void init(const SampleGeometry& input);
  void fill(Slot& slot, WorkerState& state);
  void fill_encoded(Slot& slot, WorkerState& state, const Tensor& images);
  // One encoded sample into `out` (u8 HWC); returns its label. Throws rn::Error naming the
  // file. Bad files are handled by the caller.
  // `crop` (defer_crop_flip): receives the flip, which is then not rendered; else nullptr.
  int load_encoded(int64_t index, Rng& rng, uint8_t* out, int32_t* crop, WorkerState& state,
                   PipelineTimes& times) const;
  static int32_t* crop_of(Slot& slot, int64_t i);  // image i's (y0, x0, flip)
  void mark_bad(int64_t index, const std::string& message);
  void finish(Slot& slot, uint64_t generation);  // under mu_
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const ImageTransform> transform_;
  std::shared_ptr<const EncodedDataset> encoded_;  // set for encoded datasets (then transform_ is null)
  std::shared_ptr<const ImageAugment> augment_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<DecodedCache> cache_;
  mutable std::mutex bad_mu_;
  std::unordered_set<int64_t> bad_;
  DataLoaderOptions options_;
  SampleGeometry geometry_;
  int64_t samples_per_epoch_ = 0;
  int64_t batches_per_epoch_ = 0;

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for a batch to claim
  std::condition_variable ready_cv_;  // the consumer waits for its batch
  std::vector<Slot> slots_;
  std::vector<int64_t> order_;           // this rank's dataset indices for the epoch
  std::atomic<uint64_t> generation_{0};  // written under mu_, read by filling workers to drop stale work
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  bool stop_ = false;
  int64_t epoch_ = 0;
  int64_t next_claim_ = 0;    // next batch a worker may take
  int64_t next_deliver_ = 0;  // next batch the consumer receives
  int held_ = -1;             // slot the consumer holds
  std::vector<std::thread> workers_;
  WorkerState inline_state_;  // workers = 0
  void stop_workers();        // tells the workers to stop and joins them

  double epoch_wait_seconds_ = 0;  // consumer thread only
  double total_wait_seconds_ = 0;
  PipelineTimes epoch_times_;
  PipelineTimes total_times_;
};

}  // namespace rn

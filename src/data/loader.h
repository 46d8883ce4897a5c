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
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/transform.h"

namespace rn {

struct DataLoaderOptions {
  int64_t batch_size = 128;  // per rank
  int workers = 2;           // loading threads; 0 loads each batch inside next(), on the consumer's thread
  int prefetch = 4;          // batches the workers may have ready or in progress ahead of the consumer
  bool shuffle = true;       // permute each epoch with (seed, epoch); false: dataset order
  bool drop_last = true;     // drop this rank's final partial batch; false keeps it (size < batch_size)
  uint64_t seed = 0;         // shuffle and augmentation
  ShardSpec shard;           // rank, world_size, equal-size slices
  DType dtype = DType::f32;  // batch images: f32 or bf16
  Layout layout = Layout::nchw;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const ImageTransform> transform,
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

 private:
  enum class SlotState { free, filling, ready, held };
  struct Slot {
    HostBuffer image_buffer;
    HostBuffer label_buffer;
    std::vector<int64_t> indices;  // dataset indices of the batch in progress
    SlotState state = SlotState::free;
    uint64_t generation = 0;  // start_epoch count when claimed; stale work is thrown away
    int64_t batch = -1;
    int64_t epoch = 0;
    int64_t count = 0;
    std::exception_ptr error;
    Batch view;
  };
  struct WorkerState {
    Sample sample;
    TransformScratch scratch;
  };

  bool can_claim() const;
  Slot& claim(uint64_t* generation);  // under mu_: takes batch next_claim_
  void fill(Slot& slot, WorkerState& state) const;
  void finish(Slot& slot, uint64_t generation);  // under mu_
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const ImageTransform> transform_;
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

  double epoch_wait_seconds_ = 0;  // consumer thread only
  double total_wait_seconds_ = 0;
};

}  // namespace rn

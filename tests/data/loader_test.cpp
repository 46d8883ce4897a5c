// The loader: determinism across worker counts, epoch shuffling and rank sharding,
// drop_last, exact resume, restarts, early destruction, error propagation, wait time.
#include "data/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "data/sampler.h"
#include "data/synthetic_dataset.h"
#include "data/transform.h"

namespace rn {
namespace {

using ::testing::HasSubstr;

// A small synthetic dataset that can be made slow or made to fail at one index.
class TestDataset : public Dataset {
 public:
  explicit TestDataset(int64_t size, int64_t fail_at = -1, int sleep_us = 0, int bad_label_at = -1)
      : base_({1, 8, 8, 5, size, 11}), fail_at_(fail_at), sleep_us_(sleep_us), bad_label_at_(bad_label_at) {}
  int64_t size() const override { return base_.size(); }
  int num_classes() const override { return base_.num_classes(); }
  SampleGeometry geometry() const override { return base_.geometry(); }
  std::string name() const override { return "test-dataset"; }
  void load(int64_t index, Sample& out) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    RN_CHECK(index != fail_at_) << "corrupt sample in /data/bad.bin";
    base_.load(index, out);
    if (index == bad_label_at_) out.label = 99;
    ++loads;
  }
  mutable std::atomic<int64_t> loads{0};

 private:
  SyntheticDataset base_;
  int64_t fail_at_;
  int sleep_us_;
  int64_t bad_label_at_;
};

struct BatchCopy {
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;
  int64_t index = 0, epoch = 0, size = 0;
  bool operator==(const BatchCopy&) const = default;
};

BatchCopy copy(const Batch& b) {
  BatchCopy c;
  const auto* p = static_cast<const uint8_t*>(b.images.data);
  c.images.assign(p, p + b.images.bytes());
  c.labels.assign(b.label_data(), b.label_data() + b.size);
  c.indices.assign(b.sample_indices.begin(), b.sample_indices.end());
  c.index = b.index;
  c.epoch = b.epoch;
  c.size = b.size;
  return c;
}

std::vector<BatchCopy> run_epoch(DataLoader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<BatchCopy> out;
  while (const Batch* b = loader.next()) out.push_back(copy(*b));
  return out;
}

DataLoaderOptions options(int workers, int64_t batch = 16) {
  DataLoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = 3;
  o.seed = 1234;
  return o;
}

std::shared_ptr<const ImageTransform> train_transform() { return small_image_train_transform(2, {0.3f}, {0.4f}); }

TEST(Sampler, ShardsAreDisjointCoveringAndEpochDependent) {
  const int64_t n = 100;
  for (bool equal : {true, false}) {
    std::set<int64_t> seen;
    int64_t total = 0;
    for (int r = 0; r < 3; ++r) {
      auto idx = epoch_indices(n, 7, 0, true, {r, 3, equal});
      if (equal) {
        EXPECT_EQ(idx.size(), 33u);
      }
      total += static_cast<int64_t>(idx.size());
      seen.insert(idx.begin(), idx.end());
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total);  // disjoint
    EXPECT_EQ(total, equal ? 99 : 100);                   // covering (all but the remainder)
  }
  const auto e0 = epoch_permutation(n, 7, 0, true), e1 = epoch_permutation(n, 7, 1, true);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, epoch_permutation(n, 7, 0, true));
  EXPECT_NE(e0, epoch_permutation(n, 8, 0, true));
  EXPECT_EQ(std::set<int64_t>(e1.begin(), e1.end()).size(), 100u);
  const auto plain = epoch_permutation(n, 7, 3, false);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(plain[static_cast<size_t>(i)], i);
  EXPECT_THROW(epoch_indices(n, 7, 0, true, {3, 3, true}), Error);
}

TEST(DataLoader, SameBatchesWhateverTheWorkerCount) {
  auto ds = std::make_shared<TestDataset>(100);
  std::vector<std::vector<BatchCopy>> runs;
  for (int workers : {1, 3, 0}) {
    DataLoaderOptions o = options(workers);
    o.prefetch = workers == 3 ? 5 : 1;
    DataLoader loader(ds, train_transform(), o);
    std::vector<BatchCopy> both = run_epoch(loader, 0);
    for (BatchCopy& b : run_epoch(loader, 1)) both.push_back(std::move(b));
    runs.push_back(std::move(both));
  }
  ASSERT_EQ(runs[0].size(), 12u);  // 2 epochs x 6 batches
  EXPECT_TRUE(runs[0] == runs[1]);
  EXPECT_TRUE(runs[0] == runs[2]);
  EXPECT_NE(runs[0][0].indices, runs[0][6].indices);  // epoch 1 is shuffled differently
  EXPECT_EQ(runs[0][6].epoch, 1);
}

TEST(DataLoader, AugmentationDependsOnEpochNotOnlySample) {
  auto ds = std::make_shared<TestDataset>(64);
  DataLoaderOptions o = options(2);
  o.shuffle = false;
  DataLoader loader(ds, train_transform(), o);
  auto e0 = run_epoch(loader, 0), e1 = run_epoch(loader, 1);
  ASSERT_EQ(e0.size(), 4u);
  EXPECT_EQ(e0[0].indices, e1[0].indices);
  EXPECT_EQ(e0[0].labels, e1[0].labels);
  EXPECT_NE(e0[0].images, e1[0].images);
}

TEST(DataLoader, RanksGetDisjointEqualSlices) {
  auto ds = std::make_shared<TestDataset>(100);
  std::set<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    DataLoaderOptions o = options(2, 5);
    o.shard = {rank, 4, true};
    DataLoader loader(ds, train_transform(), o);
    EXPECT_EQ(loader.samples_per_epoch(), 25);
    EXPECT_EQ(loader.batches_per_epoch(), 5);
    auto batches = run_epoch(loader, 2);
    ASSERT_EQ(batches.size(), 5u);
    std::vector<int64_t> order;
    for (const BatchCopy& b : batches) order.insert(order.end(), b.indices.begin(), b.indices.end());
    EXPECT_EQ(order, epoch_indices(100, o.seed, 2, true, o.shard));
    seen.insert(order.begin(), order.end());
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(DataLoader, DropLastOrKeepPartialBatch) {
  auto ds = std::make_shared<TestDataset>(100);
  DataLoaderOptions o = options(2);
  DataLoader dropping(ds, train_transform(), o);
  EXPECT_EQ(dropping.batches_per_epoch(), 6);
  auto a = run_epoch(dropping, 0);
  ASSERT_EQ(a.size(), 6u);
  for (const BatchCopy& b : a) EXPECT_EQ(b.size, 16);

  o.drop_last = false;
  DataLoader keeping(ds, train_transform(), o);
  EXPECT_EQ(keeping.batches_per_epoch(), 7);
  keeping.start_epoch(0);
  std::set<int64_t> seen;
  int64_t count = 0;
  while (const Batch* b = keeping.next()) {
    EXPECT_EQ(b->images.shape, (Shape{b->size, 1, 8, 8}));
    EXPECT_EQ(b->labels.shape, (Shape{b->size}));
    seen.insert(b->sample_indices.begin(), b->sample_indices.end());
    count += b->size;
    if (b->index == 6) {
      EXPECT_EQ(b->size, 4);
    }
  }
  EXPECT_EQ(count, 100);
  EXPECT_EQ(seen.size(), 100u);

  o.batch_size = 101;
  o.drop_last = true;
  try {
    DataLoader(ds, train_transform(), o);
    ADD_FAILURE() << "a loader without one whole batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 100 samples, fewer than one batch of 101: lower the batch size (data.batch_size; --batch for resnet bench)"),
              std::string::npos)
        << e.what();
  }
  o.shard = {1, 2, true};  // a rank's part of a data-parallel job
  o.batch_size = 51;
  try {
    DataLoader(ds, train_transform(), o);
    ADD_FAILURE() << "a loader without one whole batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 50 samples per epoch for rank 1 of 2, fewer than one batch of 51"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataLoader, ResumeMidEpochGivesTheSameBatches) {
  auto ds = std::make_shared<TestDataset>(100);
  DataLoader full(ds, train_transform(), options(2));
  auto expected = run_epoch(full, 3);
  for (int workers : {0, 3}) {
    DataLoader resumed(ds, train_transform(), options(workers));
    auto got = run_epoch(resumed, 3, 4);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(got[0] == expected[4]);
    EXPECT_TRUE(got[1] == expected[5]);
    EXPECT_TRUE(run_epoch(resumed, 3, 6).empty());
  }
}

TEST(DataLoader, RestartingAnEpochMidwayDropsStaleBatches) {
  auto ds = std::make_shared<TestDataset>(200, -1, 50);
  DataLoader reference(ds, train_transform(), options(0));
  auto expected = run_epoch(reference, 1);
  DataLoader loader(ds, train_transform(), options(3));
  loader.start_epoch(0);
  ASSERT_NE(loader.next(), nullptr);
  ASSERT_NE(loader.next(), nullptr);
  EXPECT_TRUE(run_epoch(loader, 1) == expected);  // workers were mid-batch in epoch 0
}

TEST(DataLoader, BatchDtypesAndLayoutsCarryTheSameValues) {
  auto ds = std::make_shared<TestDataset>(40);
  DataLoaderOptions o = options(2, 8);
  DataLoader f32_nchw(ds, train_transform(), o);
  o.dtype = DType::bf16;
  o.layout = Layout::nhwc;
  DataLoader bf16_nhwc(ds, train_transform(), o);
  f32_nchw.start_epoch(0);
  bf16_nhwc.start_epoch(0);
  const Batch* a = f32_nchw.next();
  const Batch* b = bf16_nhwc.next();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->images.dtype, DType::bf16);
  EXPECT_EQ(b->images.layout, Layout::nhwc);
  for (int64_t n = 0; n < 8; ++n)
    for (int64_t y = 0; y < 8; ++y)
      for (int64_t x = 0; x < 8; ++x) {
        const float fa = a->images.ptr<float>()[a->images.offset(n, 0, y, x)];
        const float fb = bf16_to_f32(bf16_t{b->images.ptr<uint16_t>()[b->images.offset(n, 0, y, x)]});
        ASSERT_EQ(round_to_dtype(fa, DType::bf16), fb);
      }
}

TEST(DataLoader, EarlyDestructionDoesNotHang) {
  auto ds = std::make_shared<TestDataset>(1000, -1, 200);
  const auto t0 = std::chrono::steady_clock::now();
  { DataLoader never_started(ds, train_transform(), options(3)); }
  {
    DataLoader started(ds, train_transform(), options(3));
    started.start_epoch(0);
  }
  {
    DataLoader one_batch(ds, train_transform(), options(3));
    one_batch.start_epoch(0);
    ASSERT_NE(one_batch.next(), nullptr);  // the consumer stops here with workers busy and the queue full
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_LT(ds->loads.load(), 1000);  // the workers did not finish the epoch first
}

TEST(DataLoader, WorkerErrorsReachTheConsumer) {
  for (int workers : {0, 2}) {
    auto ds = std::make_shared<TestDataset>(64, 37);
    DataLoaderOptions o = options(workers);
    o.shuffle = false;
    DataLoader loader(ds, train_transform(), o);
    loader.start_epoch(0);
    ASSERT_NE(loader.next(), nullptr);  // samples 0..15
    ASSERT_NE(loader.next(), nullptr);  // 16..31
    try {
      loader.next();  // 32..47 holds sample 37
      ADD_FAILURE() << "no error from the failing sample";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("loading sample 37 of test-dataset (epoch 1, batch 3)"));
      EXPECT_THAT(e.what(), HasSubstr("corrupt sample in /data/bad.bin"));
    }
    const Batch* last = loader.next();  // that batch is lost; the epoch goes on
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(last->index, 3);
    EXPECT_EQ(loader.next(), nullptr);
  }
}

TEST(DataLoader, LabelsOutOfRangeAreErrors) {
  auto ds = std::make_shared<TestDataset>(32, -1, 0, 5);
  DataLoaderOptions o = options(1);
  o.shuffle = false;
  DataLoader loader(ds, train_transform(), o);
  loader.start_epoch(0);
  try {
    loader.next();
    ADD_FAILURE() << "no error for label 99";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("label 99 outside [0, 5)"));
  }
}

TEST(DataLoader, MeasuresConsumerWaitTime) {
  auto ds = std::make_shared<TestDataset>(64, -1, 500);  // 8 ms per batch of 16
  DataLoader loader(ds, train_transform(), options(1));
  EXPECT_THROW(loader.next(), Error);  // before start_epoch
  run_epoch(loader, 0);
  const double first = loader.epoch_wait_seconds();
  EXPECT_GT(first, 0.01);
  EXPECT_LT(first, 5.0);
  loader.start_epoch(1);
  EXPECT_EQ(loader.epoch_wait_seconds(), 0.0);
  while (loader.next()) {
  }
  EXPECT_GT(loader.epoch_wait_seconds(), 0.01);
  EXPECT_NEAR(loader.total_wait_seconds(), first + loader.epoch_wait_seconds(), 1e-9);
}

// Device augmentation: the loader copies raw pixels and each image's (y0, x0, flip); the
// crop, flip and normalisation done from them (as crop_flip_normalize does on the device)
// give exactly the batch the loader writes when it does all of it itself.
TEST(DataLoader, DeferredCropFlipGivesTheAugmentedBatch) {
  auto ds = std::make_shared<TestDataset>(64);
  auto transform = small_image_train_transform(2, {0.3f}, {0.4f});
  DataLoaderOptions o = options(2);
  o.layout = Layout::nhwc;
  DataLoader f32(ds, transform, o);
  o.dtype = DType::u8;
  o.defer_crop_flip = true;
  DataLoader u8(ds, transform, o);
  int flips = 0, shifted = 0;
  for (int64_t epoch : {0, 3}) {
    f32.start_epoch(epoch);
    u8.start_epoch(epoch);
    while (const Batch* a = f32.next()) {
      const Batch* b = u8.next();
      ASSERT_NE(b, nullptr);
      ASSERT_NE(b->crops.data, nullptr);
      EXPECT_EQ(b->crops.shape, Shape({16, 3}));
      EXPECT_EQ(a->crops.data, nullptr);  // the f32 batch is augmented already
      ASSERT_EQ(std::vector<int64_t>(a->sample_indices.begin(), a->sample_indices.end()),
                std::vector<int64_t>(b->sample_indices.begin(), b->sample_indices.end()));
      const auto* raw = b->images.ptr<const uint8_t>();
      const auto* crops = b->crops.ptr<const int32_t>();
      const auto* expect = a->images.ptr<const float>();
      for (int64_t n = 0; n < 16; ++n) {
        const int y0 = crops[3 * n], x0 = crops[3 * n + 1];
        const bool flip = crops[3 * n + 2] != 0;
        EXPECT_TRUE(y0 >= -2 && y0 <= 2 && x0 >= -2 && x0 <= 2) << y0 << ", " << x0;
        flips += flip;
        shifted += y0 != 0 || x0 != 0;
        for (int p = 0; p < 8; ++p)
          for (int q = 0; q < 8; ++q) {
            const int sy = y0 + p, sx = x0 + (flip ? 7 - q : q);
            const bool inside = sy >= 0 && sy < 8 && sx >= 0 && sx < 8;
            const uint8_t v = inside ? raw[(n * 8 + sy) * 8 + sx] : 0;
            const float got = expect[(n * 8 + p) * 8 + q];
            ASSERT_EQ(got, transform->normalized(0, v)) << "image " << n << " at " << p << ", " << q;
          }
      }
    }
    EXPECT_EQ(u8.next(), nullptr);
  }
  EXPECT_GT(flips, 0);
  EXPECT_GT(shifted, 0);
}

// Batch buffers come from the given memory space (a device backend's pinned memory).
TEST(DataLoader, BatchBuffersComeFromTheGivenMemory) {
  struct Counting final : MemorySpace {
    Device device() const override { return Device::cpu; }
    void* allocate(size_t bytes) override {
      ++allocations;
      return host_memory().allocate(bytes);
    }
    void free(void* p) noexcept override { host_memory().free(p); }
    void copy(void* d, const void* s, size_t n) override { host_memory().copy(d, s, n); }
    void zero(void* p, size_t n) override { host_memory().zero(p, n); }
    int allocations = 0;
  } counting;
  auto ds = std::make_shared<TestDataset>(64);
  DataLoaderOptions o = options(1);
  o.batch_memory = &counting;
  o.dtype = DType::u8;
  o.layout = Layout::nhwc;
  o.defer_crop_flip = true;
  {
    DataLoader loader(ds, train_transform(), o);
    EXPECT_EQ(counting.allocations, 3 * (o.prefetch + 1));  // images, labels, crops per slot
    loader.start_epoch(0);
    EXPECT_NE(loader.next(), nullptr);
  }
}

TEST(DataLoader, RejectsBadOptions) {
  auto ds = std::make_shared<TestDataset>(64);
  DataLoaderOptions o = options(1);
  o.dtype = DType::f16;
  EXPECT_THROW(DataLoader(ds, train_transform(), o), Error);
  o = options(1);
  o.shard = {2, 2, true};
  EXPECT_THROW(DataLoader(ds, train_transform(), o), Error);
  o = options(1);
  DataLoader loader(ds, train_transform(), o);
  EXPECT_THROW(loader.start_epoch(0, 5), Error);  // 4 batches per epoch
  auto rgb = small_image_train_transform(4, {0.5f, 0.5f, 0.5f}, {0.2f, 0.2f, 0.2f});
  EXPECT_THROW(DataLoader(ds, rgb, options(1)), Error);  // 3-channel normalisation, 1-channel data
  o = options(1);
  o.dtype = DType::u8;  // raw pixels only when the device does the transform
  o.layout = Layout::nhwc;
  EXPECT_THROW(DataLoader(ds, train_transform(), o), Error);
  o.layout = Layout::nchw;
  o.defer_crop_flip = true;
  EXPECT_THROW(DataLoader(ds, train_transform(), o), Error);  // u8 batches are NHWC
  o = options(1);
  o.defer_crop_flip = true;  // the device normalises too: u8 only
  EXPECT_THROW(DataLoader(ds, train_transform(), o), Error);
}

}  // namespace
}  // namespace rn

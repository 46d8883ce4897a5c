// BatchFeeder: u8 batches are normalised by the backend exactly as the loader's Normalizer
// would, with the crops and flips the loader left to the device; batches already in the
// input dtype are copied; mismatched shapes are an error; on a device everything crosses
// through the backend's double-buffered Uploader in its begin/copy/end/release order.
#include "train/batch_feeder.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/normalize.h"
#include "fake_device.h"
#include "model/zoo.h"

namespace rn {
namespace {

struct Fixture {
  Model model;
  std::unique_ptr<Backend> backend = make_backend("ref");
  std::unique_ptr<Plan> plan;
  explicit Fixture(int64_t batch)
      : model(build_model("resnet20", [] {
          ModelOptions o;
          o.in_channels = 3, o.height = o.width = 8, o.num_classes = 10;
          return o;
        }())) {
    PlanOptions po;
    po.batch = batch;
    po.layout = Layout::nhwc;
    po.mode = PlanMode::eval;
    plan = std::make_unique<Plan>(model, backend.get(), po);
  }
};

TEST(BatchFeeder, NormalisesU8BatchesLikeTheLoader) {
  Fixture f(2);
  const Tensor in = f.plan->input();
  HostTensor images(in.shape, DType::u8, Layout::nhwc), labels({2}, DType::i32);
  Rng rng(9);
  for (int64_t i = 0; i < images.numel(); ++i) images.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
  labels.ptr<int32_t>()[0] = 3, labels.ptr<int32_t>()[1] = 7;
  Batch b;
  b.images = images.view();
  b.labels = labels.view();
  b.size = 2;
  const std::vector<float> mean = {0.4f, 0.5f, 0.6f}, stdv = {0.2f, 0.25f, 0.3f};
  BatchFeeder feeder(mean, stdv);
  feeder.feed(*f.plan, b);
  HostTensor expected(in.shape, DType::f32, Layout::nhwc);
  Normalizer(3, mean, stdv).apply(images.ptr<uint8_t>(), 2, expected);
  EXPECT_EQ(std::memcmp(in.data, expected.view().data, in.bytes()), 0);
  EXPECT_EQ(f.plan->labels().ptr<int32_t>()[1], 7);
  // A second batch through the same converter.
  images.ptr<uint8_t>()[0] = static_cast<uint8_t>(images.ptr<uint8_t>()[0] + 1);
  feeder.feed(*f.plan, b);
  Normalizer(3, mean, stdv).apply(images.ptr<uint8_t>(), 2, expected);
  EXPECT_EQ(std::memcmp(in.data, expected.view().data, in.bytes()), 0);
}

TEST(BatchFeeder, CopiesMatchingBatchesAndRejectsOthers) {
  Fixture f(2);
  const Tensor in = f.plan->input();
  HostTensor images(in.shape, DType::f32, Layout::nhwc), labels({2}, DType::i32);
  for (int64_t i = 0; i < images.numel(); ++i) images.ptr<float>()[i] = static_cast<float>(i) * 0.5f;
  Batch b;
  b.images = images.view();
  b.labels = labels.view();
  b.size = 2;
  BatchFeeder feeder({0.5f}, {0.25f});
  feeder.feed(*f.plan, b);
  EXPECT_EQ(std::memcmp(in.data, images.view().data, in.bytes()), 0);
  HostTensor wrong({1, 3, 8, 8}, DType::f32, Layout::nhwc);
  b.images = wrong.view();
  EXPECT_THROW(feeder.feed(*f.plan, b), Error);
}

// A plan made again (another memory level, another dtype) may sit at the old one's address:
// the feeder must not reuse what it made for the old plan.
TEST(BatchFeeder, ANewPlanAtTheSameAddressGetsItsOwnConverter) {
  Model model(build_model("resnet20", [] {
    ModelOptions o;
    o.in_channels = 3, o.height = o.width = 8, o.num_classes = 10;
    return o;
  }()));
  auto backend = make_backend("cpu");  // bf16 plans
  const std::vector<float> mean = {0.4f, 0.5f, 0.6f}, stdv = {0.2f, 0.25f, 0.3f};
  BatchFeeder feeder(mean, stdv);
  HostTensor images({2, 3, 8, 8}, DType::u8, Layout::nhwc), labels({2}, DType::i32);
  for (int64_t i = 0; i < images.numel(); ++i) images.ptr<uint8_t>()[i] = static_cast<uint8_t>(i * 13);
  Batch b;
  b.images = images.view();
  b.labels = labels.view();
  b.size = 2;
  const Plan* first_address = nullptr;
  int same_address = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f32, DType::bf16}) {
    PlanOptions po;
    po.batch = 2;
    po.layout = Layout::nhwc;
    po.mode = PlanMode::eval;
    po.dtype = po.activation_dtype = dtype;
    auto plan = std::make_unique<Plan>(model, backend.get(), po);
    if (!first_address) first_address = plan.get();
    same_address += plan.get() == first_address;
    feeder.feed(*plan, b);
    HostTensor expected({2, 3, 8, 8}, dtype, Layout::nhwc);
    Normalizer(3, mean, stdv).apply(images.ptr<uint8_t>(), 2, expected);
    EXPECT_EQ(std::memcmp(plan->input().data, expected.view().data, expected.view().bytes()), 0)
        << dtype_name(dtype);
  }
  std::printf("[batch-feeder] %d of 4 plans reused the first one's address\n", same_address);
}

TEST(BatchFeeder, LoaderDtype) {
  auto cpu = make_backend("ref");
  EXPECT_EQ(loader_dtype_for(DType::f32, *cpu), DType::f32);  // host: the loader normalises
  EXPECT_EQ(loader_dtype_for(DType::bf16, *cpu), DType::bf16);
  EXPECT_EQ(loader_dtype_for(DType::f16, *cpu), DType::f32);  // the loader writes no fp16
}

// Uploads through two buffers, recording every call and checking the protocol.
class RecordingUploader final : public Uploader {
 public:
  RecordingUploader(MemorySpace& m, size_t bytes, std::vector<std::string>& log)
      : a_(m, bytes), b_(m, bytes), log_(log) {}
  void* begin() override {
    EXPECT_FALSE(open_);
    open_ = true;
    current_ = current_ == a_.data() ? b_.data() : a_.data();
    log_.push_back(current_ == a_.data() ? "begin 0" : "begin 1");
    return current_;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    EXPECT_TRUE(open_);
    EXPECT_TRUE(dst >= current_ && static_cast<char*>(dst) + bytes <= static_cast<char*>(current_) + a_.bytes());
    std::memcpy(dst, src, bytes);
    log_.push_back("copy");
  }
  void end() override {
    EXPECT_TRUE(open_);
    open_ = false;
    log_.push_back("end");
  }
  void release() override { log_.push_back("release"); }

 private:
  DeviceBuffer a_, b_;
  void* current_ = nullptr;
  bool open_ = false;
  std::vector<std::string>& log_;
};

TEST(BatchFeeder, DeviceBatchesCrossThroughTheUploaderWithTheirCrops) {
  testing::FakeDevice device("ref");
  std::vector<std::string> log;
  device.uploader = [&log](MemorySpace& m, size_t bytes) { return std::make_unique<RecordingUploader>(m, bytes, log); };
  EXPECT_EQ(loader_dtype_for(DType::f16, device), DType::u8);  // the device normalises
  Model model(build_model("resnet20", [] {
    ModelOptions o;
    o.in_channels = 3, o.height = o.width = 8, o.num_classes = 10;
    return o;
  }()));
  PlanOptions po;
  po.batch = 3;
  po.layout = Layout::nhwc;
  po.mode = PlanMode::eval;
  Plan plan(model, &device, po);
  const Tensor in = plan.input();
  const std::vector<float> mean = {0.4f, 0.5f, 0.6f}, stdv = {0.2f, 0.25f, 0.3f};
  BatchFeeder feeder(mean, stdv);
  CropFlipNormalizeDesc d;
  d.batch = 3, d.channels = 3, d.src_h = d.out_h = 8, d.src_w = d.out_w = 8;
  d.mean = mean, d.std = stdv, d.layout = Layout::nhwc;
  auto reference = make_host_crop_flip_normalize(d);
  Rng rng(4);
  for (int k = 0; k < 3; ++k) {
    HostTensor images(in.shape, DType::u8, Layout::nhwc), labels({3}, DType::i32), crops({3, 3}, DType::i32);
    for (int64_t i = 0; i < images.numel(); ++i) images.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
    for (int n = 0; n < 3; ++n) {
      labels.ptr<int32_t>()[n] = static_cast<int32_t>(rng.below(10));
      crops.ptr<int32_t>()[3 * n] = static_cast<int32_t>(rng.below(5)) - 2;
      crops.ptr<int32_t>()[3 * n + 1] = static_cast<int32_t>(rng.below(5)) - 2;
      crops.ptr<int32_t>()[3 * n + 2] = static_cast<int32_t>(rng.below(2));
    }
    Batch b;
    b.images = images.view();
    b.labels = labels.view();
    b.crops = crops.view();
    b.size = 3;
    log.clear();
    feeder.feed(plan, b);
    // Staged, then converted: begin, images, labels, crops, end, release; buffers alternate.
    const std::vector<std::string> expected_log = {k % 2 == 0 ? "begin 0" : "begin 1", "copy", "copy", "copy", "end",
                                                   "release"};
    EXPECT_EQ(log, expected_log) << "batch " << k;
    HostTensor expect(in.shape, DType::f32, Layout::nhwc);
    reference->forward(expect, images.view(), crops.view());
    EXPECT_EQ(std::memcmp(in.data, expect.view().data, in.bytes()), 0) << "batch " << k;
    EXPECT_EQ(std::memcmp(plan.labels().data, labels.view().data, 3 * sizeof(int32_t)), 0);
  }
  // Batches without crops (the loader cropped and flipped itself) are only normalised.
  HostTensor images(in.shape, DType::u8, Layout::nhwc), labels({3}, DType::i32);
  for (int64_t i = 0; i < images.numel(); ++i) images.ptr<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  Batch b;
  b.images = images.view();
  b.labels = labels.view();
  b.size = 3;
  feeder.feed(plan, b);
  HostTensor expect(in.shape, DType::f32, Layout::nhwc);
  Normalizer(3, mean, stdv).apply(images.ptr<uint8_t>(), 3, expect);
  EXPECT_EQ(std::memcmp(in.data, expect.view().data, in.bytes()), 0);
  // Crops of the wrong shape are refused.
  HostTensor wrong({3, 2}, DType::i32);
  b.crops = wrong.view();
  EXPECT_THROW(feeder.feed(plan, b), Error);
}

}  // namespace
}  // namespace rn

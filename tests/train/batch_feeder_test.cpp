// BatchFeeder: u8 batches are normalised by the backend exactly as the loader's Normalizer
// would; batches already in the input dtype are copied; mismatched shapes are an error.
#include "train/batch_feeder.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/rng.h"
#include "data/normalize.h"
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

TEST(BatchFeeder, LoaderDtype) {
  auto cpu = make_backend("ref");
  EXPECT_EQ(loader_dtype_for(true, DType::f32, *cpu), DType::f32);  // host: the loader normalises
  EXPECT_EQ(loader_dtype_for(false, DType::bf16, *cpu), DType::bf16);
  EXPECT_EQ(loader_dtype_for(false, DType::f16, *cpu), DType::f32);  // the loader writes no fp16
}

}  // namespace
}  // namespace rn

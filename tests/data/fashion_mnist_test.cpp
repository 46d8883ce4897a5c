// The real Fashion-MNIST files from Debian's dataset-fashion-mnist package, when installed:
// sizes, geometry, labels, the normalisation constants, and loader throughput on one core.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "data/idx_dataset.h"
#include "data/loader.h"
#include "data/transform.h"

namespace rn {
namespace {

#define RN_REQUIRE_FASHION_MNIST()                                  \
  if (!fashion_mnist_available(kFashionMnistDir))                   \
  GTEST_SKIP() << "Fashion-MNIST not found in " << kFashionMnistDir \
               << " (install Debian's dataset-fashion-mnist package)"

TEST(FashionMnist, TrainAndTestSets) {
  RN_REQUIRE_FASHION_MNIST();
  for (auto [split, count] : {std::pair{Split::train, 60000}, std::pair{Split::test, 10000}}) {
    auto ds = fashion_mnist(kFashionMnistDir, split);
    EXPECT_EQ(ds->size(), count) << split_name(split);
    EXPECT_EQ(ds->num_classes(), 10);
    EXPECT_EQ(ds->geometry(), (SampleGeometry{1, 28, 28}));
    // Fashion-MNIST is balanced: a tenth of each split per class.
    std::vector<int64_t> per_class(10);
    for (int64_t i = 0; i < ds->size(); ++i) {
      ASSERT_LT(ds->label(i), 10);
      ++per_class[static_cast<size_t>(ds->label(i))];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[static_cast<size_t>(c)], count / 10) << "class " << c;
  }
}

TEST(FashionMnist, NormalisationConstantsMatchTrainSet) {
  RN_REQUIRE_FASHION_MNIST();
  auto ds = fashion_mnist(kFashionMnistDir, Split::train);
  double sum = 0, sum_sq = 0;
  const int64_t n = ds->size() * 28 * 28;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const uint8_t* p = ds->image(i);
    for (int k = 0; k < 28 * 28; ++k) {
      const double v = p[k] / 255.0;
      sum += v;
      sum_sq += v * v;
    }
  }
  const double mean = sum / static_cast<double>(n);
  const double std = std::sqrt(sum_sq / static_cast<double>(n) - mean * mean);
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-4);
  EXPECT_NEAR(std, kFashionMnistStd, 5e-4);
}

TEST(FashionMnist, SeededRandomSubset) {
  RN_REQUIRE_FASHION_MNIST();
  auto a = fashion_mnist(kFashionMnistDir, Split::test, SubsetSpec{500, true, 3, ""});
  auto b = fashion_mnist(kFashionMnistDir, Split::test, SubsetSpec{500, true, 3, ""});
  ASSERT_EQ(a->size(), 500);
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(0, std::memcmp(a->image(i), b->image(i), 28 * 28));
}

// The brief: well over 20,000 augmented images per second from one core. Measured with the
// loading done on the consumer's thread (workers = 0), so exactly one core works.
TEST(FashionMnist, LoaderThroughputOneCore) {
  RN_REQUIRE_FASHION_MNIST();
  auto ds = fashion_mnist(kFashionMnistDir, Split::train);
  DataLoaderOptions o;
  o.batch_size = 128;
  o.workers = 0;
  DataLoader loader(ds, small_image_train_transform(2, {kFashionMnistMean}, {kFashionMnistStd}), o);
  loader.start_epoch(0);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t images = 0;
  while (const Batch* b = loader.next()) images += b->size;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(images) / seconds;
  std::printf("fashion-mnist loader, one core, f32 nchw, crop+flip+normalize: %.0f images/s\n", rate);
  EXPECT_EQ(images, 60000 / 128 * 128);
  EXPECT_GT(rate, 20000.0);
}

}  // namespace
}  // namespace rn

// The IDX reader on small generated files: good files (gzip and plain), subsets, and every
// malformed case, each of which must be an rn::Error naming the file and the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "data/idx_dataset.h"
#include "data/idx_files.h"

namespace rn {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// 5 images of 3x4 pixels, pixel (n, y, x) = 16 n + 4 y + x; labels n * 2 (0..8).
std::vector<uint8_t> good_pixels() {
  std::vector<uint8_t> p;
  for (int n = 0; n < 5; ++n)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) p.push_back(static_cast<uint8_t>(16 * n + 4 * y + x));
  return p;
}
std::vector<uint8_t> good_labels() { return {0, 2, 4, 6, 8}; }

class IdxTest : public ::testing::Test {
 protected:
  IdxTest() : dir_(::testing::UnitTest::GetInstance()->current_test_info()->name()) {}

  // Writes images and labels files (gzip unless told) and returns their paths.
  void write(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels, bool gzip = true) {
    images_ = dir_.file(gzip ? "images-idx3-ubyte.gz" : "images-idx3-ubyte");
    labels_ = dir_.file(gzip ? "labels-idx1-ubyte.gz" : "labels-idx1-ubyte");
    test::write_file(images_, images, gzip);
    test::write_file(labels_, labels, gzip);
  }
  void write_good(bool gzip = true) {
    write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {5}, good_labels()),
          gzip);
  }
  // Opening must fail with an rn::Error whose message names `file` and contains `what`.
  void expect_error(const std::string& file, const std::string& what, int num_classes = 10) {
    IdxOptions options;
    options.num_classes = num_classes;
    try {
      IdxDataset ds(images_, labels_, options);
      ADD_FAILURE() << "opened without error; expected: " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(file));
      EXPECT_THAT(e.what(), HasSubstr(what));
      if (std::getenv("RN_TEST_VERBOSE")) std::printf("%s\n", e.what());
    }
  }

  test::TempDir dir_;
  std::string images_, labels_;
};

void expect_good(const IdxDataset& ds) {
  EXPECT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_EQ(ds.geometry(), (SampleGeometry{1, 3, 4}));
  Sample s;
  for (int n = 0; n < 5; ++n) {
    ds.load(n, s);
    ASSERT_EQ(s.channels, 1);
    ASSERT_EQ(s.height, 3);
    ASSERT_EQ(s.width, 4);
    EXPECT_EQ(s.label, 2 * n);
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) EXPECT_EQ(*s.at(y, x), 16 * n + 4 * y + x);
  }
}

TEST_F(IdxTest, ReadsGzipFiles) {
  write_good(true);
  expect_good(IdxDataset(images_, labels_));
}

TEST_F(IdxTest, ReadsUncompressedFiles) {
  write_good(false);
  expect_good(IdxDataset(images_, labels_));
}

TEST_F(IdxTest, SubsetFirstAndRandom) {
  write_good();
  IdxOptions first;
  first.subset.count = 2;
  IdxDataset a(images_, labels_, first);
  ASSERT_EQ(a.size(), 2);
  EXPECT_EQ(a.label(1), 2);
  EXPECT_EQ(a.image(1)[0], 16);

  IdxOptions random;
  random.subset = {3, true, 7, ""};
  IdxDataset b(images_, labels_, random);
  IdxDataset c(images_, labels_, random);
  ASSERT_EQ(b.size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.label(i), c.label(i));                // seeded: the same subset every time
    EXPECT_EQ(b.image(i)[0], 16 * (b.label(i) / 2));  // image and label stay paired
    if (i > 0) {
      EXPECT_GT(b.label(i), b.label(i - 1));  // ascending dataset order
    }
  }

  IdxOptions too_many;
  too_many.subset.count = 6;
  EXPECT_THROW(IdxDataset(images_, labels_, too_many), Error);
}

TEST_F(IdxTest, MissingImagesFile) {
  write_good();
  images_ = dir_.file("nope-images-idx3-ubyte.gz");
  expect_error(images_, "missing file");
}

TEST_F(IdxTest, MissingLabelsFile) {
  write_good();
  labels_ = dir_.file("nope-labels-idx1-ubyte.gz");
  expect_error(labels_, "missing file");
}

TEST_F(IdxTest, EmptyFile) {
  write({}, test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "empty file");
}

TEST_F(IdxTest, BadMagicLabelsFileAsImages) {
  write(test::idx_bytes(kLabelsMagic, {5}, good_labels()), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "bad magic 0x00000801, expected 0x00000803");
}

TEST_F(IdxTest, BadMagicImagesFileAsLabels) {
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()),
        test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()));
  expect_error(labels_, "bad magic 0x00000803, expected 0x00000801");
}

TEST_F(IdxTest, BadMagicNotIdx) {
  write(test::idx_bytes(0x89504e47, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "not an IDX file");
}

TEST_F(IdxTest, BadMagicWrongElementType) {
  write(test::idx_bytes(0x00000d03, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "f32");
}

TEST_F(IdxTest, TruncatedHeader) {
  std::vector<uint8_t> header = test::idx_bytes(kImagesMagic, {5}, {});  // 8 of the 16 header bytes
  write(header, test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "truncated header: expected 16 bytes, got 8");
}

TEST_F(IdxTest, ZeroDimension) {
  write(test::idx_bytes(kImagesMagic, {5, 0, 4}, {}), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "dimension 1 is 0");
}

TEST_F(IdxTest, TruncatedImages) {
  std::vector<uint8_t> pixels = good_pixels();
  pixels.resize(50);
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, pixels), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "truncated: expected 60 bytes of pixels, got 50");
}

TEST_F(IdxTest, TruncatedLabels) {
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {5}, {0, 1, 2}));
  expect_error(labels_, "truncated: expected 5 bytes of labels, got 3");
}

TEST_F(IdxTest, TruncatedGzipStream) {
  // A .gz file cut in the middle of its compressed data: still a truncation, not a crash.
  std::vector<uint8_t> big(4000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 7919) >> 3);
  write(test::idx_bytes(kImagesMagic, {1000, 2, 2}, big), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  std::ifstream in(images_, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  bytes.resize(bytes.size() / 2);
  std::ofstream(images_, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<long>(bytes.size()));
  expect_error(images_, "truncated");
}

TEST_F(IdxTest, TrailingBytesAfterImages) {
  std::vector<uint8_t> pixels = good_pixels();
  pixels.insert(pixels.end(), {1, 2, 3});
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, pixels), test::idx_bytes(kLabelsMagic, {5}, good_labels()));
  expect_error(images_, "trailing garbage: 3 bytes");
}

TEST_F(IdxTest, TrailingBytesAfterLabels) {
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()),
        test::idx_bytes(kLabelsMagic, {5}, {0, 1, 2, 3, 4, 5}));
  expect_error(labels_, "trailing garbage: 1 byte after");
}

TEST_F(IdxTest, CountMismatch) {
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {4}, {0, 1, 2, 3}));
  expect_error(images_, "count mismatch");
  expect_error(labels_, "has 4 labels");
}

TEST_F(IdxTest, LabelOutOfRange) {
  write(test::idx_bytes(kImagesMagic, {5, 3, 4}, good_pixels()), test::idx_bytes(kLabelsMagic, {5}, {0, 1, 10, 3, 4}));
  expect_error(labels_, "label 10 at index 2 is out of range (num_classes 10)");
  write_good();
  expect_error(labels_, "label 6 at index 3 is out of range (num_classes 5)", 5);
}

TEST(FashionMnistPaths, StandardLayout) {
  EXPECT_EQ(fashion_mnist_images_path("/d", Split::train), "/d/train-images-idx3-ubyte.gz");
  EXPECT_EQ(fashion_mnist_labels_path("/d", Split::train), "/d/train-labels-idx1-ubyte.gz");
  EXPECT_EQ(fashion_mnist_images_path("/d", Split::test), "/d/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(fashion_mnist_labels_path("/d", Split::test), "/d/t10k-labels-idx1-ubyte.gz");
  EXPECT_FALSE(fashion_mnist_available("/nonexistent/fashion-mnist"));
  try {
    fashion_mnist("/nonexistent/fashion-mnist", Split::train);
    ADD_FAILURE() << "opened a missing folder";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz"));
    EXPECT_THAT(e.what(), HasSubstr("dataset-fashion-mnist"));
  }
}

}  // namespace
}  // namespace rn

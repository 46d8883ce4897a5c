// MNIST-format IDX files (http://yann.lecun.com/exdb/mnist/ describes the format): a
// big-endian header (magic 0x00000803 for a 3-D u8 image array, 0x00000801 for a 1-D u8
// label array, then one u32 per dimension) followed by the raw bytes. Files are read
// through zlib, so .gz and uncompressed files both work. Everything is validated on open:
// magic, dimensions, truncation, trailing bytes, image/label counts and label range; each
// problem is an rn::Error naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace rn {

struct IdxOptions {
  int num_classes = 10;  // labels must be < num_classes
  SubsetSpec subset;     // keep only part of the file (the whole file is still validated)
};

// Images and labels held in memory (Fashion-MNIST train: 47 MB). Samples are 1 x rows x cols.
class IdxDataset : public Dataset {
 public:
  IdxDataset(const std::string& images_path, const std::string& labels_path, const IdxOptions& options = {});

  int64_t size() const override { return count_; }
  int num_classes() const override { return num_classes_; }
  SampleGeometry geometry() const override { return {1, rows_, cols_}; }
  void load(int64_t index, Sample& out) const override;
  std::string name() const override { return "idx:" + images_path_; }

  // Direct access for tools and tests: the pixels of image `index` (rows * cols bytes).
  const uint8_t* image(int64_t index) const;
  int label(int64_t index) const { return labels_[static_cast<size_t>(index)]; }

 private:
  std::string images_path_;
  std::string labels_path_;
  int num_classes_ = 0;
  int rows_ = 0;
  int cols_ = 0;
  int64_t count_ = 0;
  std::vector<uint8_t> pixels_;  // count x rows x cols
  std::vector<uint8_t> labels_;  // count
};

// The raw content of one IDX file of unsigned bytes, after validation.
struct IdxArray {
  std::vector<uint32_t> dims;  // as in the header
  std::vector<uint8_t> data;   // product(dims) bytes
};

// Reads and validates an IDX u8 file with exactly `rank` dimensions (gzip or plain).
IdxArray idx_read_u8(const std::string& path, int rank);

enum class Split { train, test };
std::string_view split_name(Split split);

// Debian's dataset-fashion-mnist package installs the four files here.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Per-channel statistics of the Fashion-MNIST training images, pixels scaled to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// The image and label paths of a split in the standard layout:
// train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz, t10k-images-... for test.
std::string fashion_mnist_images_path(const std::string& dir, Split split);
std::string fashion_mnist_labels_path(const std::string& dir, Split split);
// The names of Fashion-MNIST's ten classes, by label (0 "T-shirt/top" .. 9 "Ankle boot").
const std::vector<std::string>& fashion_mnist_class_names();
// True when both files of both splits exist in `dir`.
bool fashion_mnist_available(const std::string& dir = kFashionMnistDir);
// Opens one split (10 classes, 1x28x28 once validated).
std::shared_ptr<IdxDataset> fashion_mnist(const std::string& dir, Split split, const SubsetSpec& subset = {});

}  // namespace rn

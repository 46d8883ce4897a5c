// Datasets: indexed collections of labelled uint8 images. A dataset only reads and
// decodes; augmentation lives in Transform (transform.h) and batching in Loader
// (loader.h). Every dataset, from IDX files to synthetic data to (later) JPEG folders,
// fills the same Sample, so the rest of the pipeline never knows where pixels came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rn {

// The size of the stored images. A dimension of kVariable (0) means images differ in that
// dimension (JPEG folders); a fixed-size transform must then map them to one size.
struct SampleGeometry {
  static constexpr int kVariable = 0;
  int channels = 0;
  int height = kVariable;
  int width = kVariable;

  bool fixed() const { return channels > 0 && height > 0 && width > 0; }
  int64_t pixels() const { return int64_t{channels} * height * width; }  // bytes of one fixed-size image
  bool operator==(const SampleGeometry&) const = default;
  std::string str() const;  // "1x28x28" (CxHxW) or "3xVARxVAR"
};

// One decoded image: uint8 pixels in HWC order (pixel (y, x), channel c at
// (y * width + x) * channels + c) and its class. A worker keeps one Sample and reuses it
// for every load, so the pixel storage is allocated once, not per sample.
struct Sample {
  std::vector<uint8_t> pixels;
  int channels = 0;
  int height = 0;
  int width = 0;
  int label = -1;

  // Sets the size and makes room for the pixels, reusing the existing storage.
  uint8_t* resize(int c, int h, int w) {
    channels = c;
    height = h;
    width = w;
    pixels.resize(static_cast<size_t>(c) * static_cast<size_t>(h) * static_cast<size_t>(w));
    return pixels.data();
  }
  const uint8_t* at(int y, int x) const {
    return pixels.data() + (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) *
                               static_cast<size_t>(channels);
  }
};

// The interface every dataset implements. load() must be safe to call concurrently from
// several threads on the same object (the loader's workers share one dataset).
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  virtual int num_classes() const = 0;
  virtual SampleGeometry geometry() const = 0;
  // Fills `out` with sample `index` in [0, size()). Throws rn::Error naming the source
  // (file, index) on bad data.
  virtual void load(int64_t index, Sample& out) const = 0;
  // A short description for logs and errors: "idx:/path/train-images-idx3-ubyte.gz".
  virtual std::string name() const = 0;
};

// Which part of a dataset to keep, for quick tests and small runs: everything (count < 0),
// the first `count` samples, or `count` samples drawn without replacement with `seed`
// (kept in ascending index order).
struct SubsetSpec {
  int64_t count = -1;
  bool random = false;
  uint64_t seed = 0;
  std::string setting;  // the config key that asked for it ("data.train_subset"), named in errors

  bool all() const { return count < 0; }
};

// The dataset indices a SubsetSpec selects from a dataset of `size` samples, ascending.
// A count larger than size is an error (a typo should not silently train on everything); the
// message names spec.setting and `source` (the dataset) where given.
std::vector<int64_t> subset_indices(int64_t size, const SubsetSpec& spec, const std::string& source = "");

// A view of another dataset restricted to some of its indices.
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  SubsetDataset(std::shared_ptr<const Dataset> base, const SubsetSpec& spec);

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  int num_classes() const override { return base_->num_classes(); }
  SampleGeometry geometry() const override { return base_->geometry(); }
  void load(int64_t index, Sample& out) const override;
  std::string name() const override;
  // The index in the base dataset of subset sample `index`.
  int64_t base_index(int64_t index) const { return indices_[static_cast<size_t>(index)]; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

}  // namespace rn

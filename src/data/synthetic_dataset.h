// Synthetic images of any shape, generated on the fly and deterministic per index, so that
// benchmarks and tests need no data on disk. Labels are uniform over the classes; pixels are
// noise around a per-class, per-channel level, so a model can learn the classes (a quick
// check that training works end to end) while the content costs almost nothing to make.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace rn {

struct SyntheticOptions {
  int channels = 3;
  int height = 224;
  int width = 224;
  int num_classes = 1000;
  int64_t size = 1281167;  // an ImageNet-1k epoch
  uint64_t seed = 0;
};

class SyntheticDataset : public Dataset {
 public:
  explicit SyntheticDataset(const SyntheticOptions& options);

  int64_t size() const override { return options_.size; }
  int num_classes() const override { return options_.num_classes; }
  SampleGeometry geometry() const override { return {options_.channels, options_.height, options_.width}; }
  void load(int64_t index, Sample& out) const override;
  std::string name() const override;

 private:
  SyntheticOptions options_;
};

}  // namespace rn

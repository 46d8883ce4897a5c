// Datasets of encoded images (JPEG folders, list files, packed shards). The loader reads
// the bytes, plans the crop from the header, and decodes only what the crop needs (see
// image_codec.h); load() is the plain full-size decode for tools and tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_codec.h"

namespace rn {

class EncodedDataset : public Dataset {
 public:
  // Reads the encoded bytes of sample `index` into `out` (reusing its storage) and returns
  // its label. Safe to call concurrently. Throws rn::Error naming source(index) when the
  // bytes cannot be read (a missing file, a checksum mismatch).
  virtual int read(int64_t index, EncodedImage& out) const = 0;
  // Where sample `index` comes from, for logs and errors: a path, or "FOLDER/shard-00003.tar:key".
  virtual std::string source(int64_t index) const = 0;
  // The class names, index = label.
  virtual const std::vector<std::string>& classes() const = 0;
  // True when the labels are positions in a model's class list rather than names to match
  // (a list file's "path label" lines, and a pack of one): classes() are then the numbers.
  virtual bool labels_are_positions() const { return false; }

  int num_classes() const override { return static_cast<int>(classes().size()); }
  // Variable-size RGB.
  SampleGeometry geometry() const override { return {3, SampleGeometry::kVariable, SampleGeometry::kVariable}; }
  // read() and a full-size decode. Errors name source(index).
  void load(int64_t index, Sample& out) const override;
};

}  // namespace rn

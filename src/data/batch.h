// One batch as the loader hands it to the trainer: views into a buffer the loader owns and
// reuses, valid until the consumer asks for the next batch.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace rn {

struct Batch {
  Tensor images;      // logical [n, C, H, W], f32 or bf16 (nchw or nhwc), or u8 nhwc; host memory
  Tensor labels;      // i32 [n], each in [0, num_classes)
  // Device augmentation (DataLoaderOptions::defer_crop_flip): i32 [n, 3], each image's
  // (y0, x0, flip) still to be applied by crop_flip_normalize (ops/augment.h); data is
  // null when the loader applied them itself.
  Tensor crops;
  int64_t size = 0;   // n: the batch size, or fewer for a kept partial last batch
  int64_t index = 0;  // position of this batch in this rank's epoch, from 0
  int64_t epoch = 0;
  std::span<const int64_t> sample_indices;  // the n dataset indices, in slot order
  // 1 where sample_indices[i] was unreadable (DataLoaderOptions::bad_files = skip) and the
  // image and label are those of the next readable sample: training may use it, evaluation
  // must leave it out. n entries.
  std::span<const uint8_t> replaced;

  const int32_t* label_data() const { return labels.ptr<const int32_t>(); }
};

}  // namespace rn

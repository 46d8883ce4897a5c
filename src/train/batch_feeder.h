// Moves loader batches into a plan's input and labels, wherever the plan's backend keeps
// them. A batch in the plan's input dtype and layout is one copy. Otherwise the conversion
// runs on the backend, after the copy (on a GPU: on the device, so the narrow form crosses):
//   u8 NHWC batches (image datasets): crop_flip_normalize (ops/augment.h) with the loader's
//     mean and std, and with the batch's own crops and flips when the loader left them to
//     the device (DataLoaderOptions::defer_crop_flip), else with none (identity crops);
//   f32 batches for an fp16/bf16 input (the loader writes f32 or bf16 only): a cast.
//
// On a device the batch crosses through the backend's Uploader (core/memory_space.h):
// images, labels and crops are copied into one of two staging buffers on a copy stream of
// their own (from the loader's pinned buffers: DataLoaderOptions::batch_memory), and the
// conversion into the plan's input is the first work the step queues on the compute
// stream. So the copy of batch i + 1 overlaps the computation of batch i, and feed()
// returns once the loader's buffers have been read (the loader may then reuse them).
// On the host the conversion reads the loader's buffers directly.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "data/batch.h"
#include "model/plan.h"

namespace rn {

class BatchFeeder {
 public:
  BatchFeeder(std::vector<float> mean, std::vector<float> std) : mean_(std::move(mean)), std_(std::move(std)) {}
  void feed(Plan& plan, const Batch& batch);
  // Drops what was made for `plan` (its staging buffers): call before the plan goes away.
  void forget(const Plan& plan) { converters_.erase(&plan); }

 private:
  struct Converter {
    DType src = DType::f32;
    const Backend* backend = nullptr;  // what it was made for: a new plan at the same address
    Tensor input;                      // (re-planned) gets a new converter when these differ
    std::unique_ptr<CropFlipNormalizeKernel> normalize;
    std::unique_ptr<CastKernel> cast;
    DeviceBuffer identity_crops;  // (0, 0, no flip) per image, for batches without crops
    // Device plans: the staging buffers and where images, labels and crops sit in them.
    std::unique_ptr<Uploader> uploader;
    size_t label_offset = 0, crop_offset = 0;
  };
  Converter& converter_for(Plan& plan, const Batch& batch);
  void convert(Plan& plan, Converter& c, const Tensor& images, const Tensor& crops);
  std::vector<float> mean_, std_;
  std::map<const Plan*, Converter> converters_;
};

// The dtype the loader should write for a plan whose input is `input_dtype` on `backend`:
// u8 on a device (every dataset holds 8-bit images; they are normalised there, and the
// loader leaves crops and flips to the device too), f32 where the loader cannot write the
// input dtype (fp16), else the input dtype itself.
DType loader_dtype_for(DType input_dtype, const Backend& backend);

}  // namespace rn

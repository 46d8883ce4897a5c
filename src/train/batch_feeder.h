// Moves loader batches into a plan's input and labels, wherever the plan's backend keeps
// them. A batch in the plan's input dtype and layout is one copy. Otherwise the conversion
// runs on the backend, after the copy (on a GPU: on the device, so the narrow form crosses):
//   u8 NHWC batches (image datasets, already cropped and flipped by the loader's
//     augmentation): crop_flip_normalize (ops/augment.h) with the loader's mean and std;
//   f32 batches for an fp16/bf16 input (the loader writes f32 or bf16 only): a cast.
// Labels are copied as they are. Copies are queued without waiting (MemorySpace::
// copy_to_device_async): the loader's buffers are pageable, which the driver stages.
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

 private:
  struct Converter {
    DeviceBuffer staging, crops;
    std::unique_ptr<CropFlipNormalizeKernel> normalize;
    std::unique_ptr<CastKernel> cast;
    DType src = DType::f32;
  };
  Converter& converter_for(Plan& plan, const Tensor& images);
  std::vector<float> mean_, std_;
  std::map<const Plan*, Converter> converters_;
};

// The dtype the loader should write for a plan whose input is `input_dtype` on `backend`:
// u8 for image datasets on a device (normalised there), f32 where the loader cannot write
// the input dtype (fp16), else the input dtype itself.
DType loader_dtype_for(bool image_dataset, DType input_dtype, const Backend& backend);

}  // namespace rn

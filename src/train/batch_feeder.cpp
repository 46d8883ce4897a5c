#include "train/batch_feeder.h"

namespace rn {

DType loader_dtype_for(bool image_dataset, DType input_dtype, const Backend& backend) {
  if (backend.device() != Device::cpu && image_dataset) return DType::u8;
  if (input_dtype == DType::f16) return DType::f32;
  return input_dtype;
}

BatchFeeder::Converter& BatchFeeder::converter_for(Plan& plan, const Tensor& images) {
  Converter& c = converters_[&plan];
  if (c.staging.data() && c.src == images.dtype) return c;
  Backend& backend = *plan.backend();
  const Tensor in = plan.input();
  c = Converter{};
  c.src = images.dtype;
  c.staging = DeviceBuffer(backend.memory(), images.bytes());
  if (images.dtype == DType::u8) {
    CropFlipNormalizeDesc d;
    d.batch = in.shape[0], d.channels = in.shape[1], d.out_h = in.shape[2], d.out_w = in.shape[3];
    d.src_h = in.shape[2], d.src_w = in.shape[3];
    d.mean = mean_, d.std = std_;
    d.dtype = in.dtype, d.layout = in.layout;
    c.normalize = backend.make_crop_flip_normalize(d);
    // The loader has cropped and flipped already: every image at (0, 0), not mirrored.
    const std::vector<int32_t> identity(static_cast<size_t>(d.batch) * 3, 0);
    c.crops = DeviceBuffer(backend.memory(), identity.size() * sizeof(int32_t));
    backend.memory().copy(c.crops.data(), identity.data(), identity.size() * sizeof(int32_t));
  } else {
    RN_CHECK(images.layout == in.layout || images.shape.rank() != 4)
        << "batch " << images.str() << " and the plan's input " << in.str() << " differ in layout";
    c.cast = backend.make_cast({in.numel(), images.dtype, in.dtype});
  }
  return c;
}

void BatchFeeder::feed(Plan& plan, const Batch& batch) {
  const Tensor in = plan.input();
  const Tensor& images = batch.images;
  RN_CHECK(images.shape == in.shape) << "batch " << images.str() << " does not match the plan's input " << in.str();
  if (images.dtype == in.dtype && images.layout == in.layout) {
    plan.copy_from_host_async(in, images.data);
  } else {
    Converter& c = converter_for(plan, images);
    Tensor staged = images;
    staged.data = c.staging.data();
    staged.device = c.staging.device();
    plan.copy_from_host_async(staged, images.data);
    if (c.normalize) {
      Tensor x{staged.data, {images.numel()}, DType::u8};
      x.device = staged.device;
      Tensor crops{c.crops.data(), {in.shape[0], 3}, DType::i32};
      crops.device = staged.device;
      c.normalize->forward(in, x, crops);
    } else {
      Tensor flat_in = in, flat_src = staged;
      flat_in.shape = {in.numel()};
      flat_src.shape = {in.numel()};
      c.cast->forward(flat_in, flat_src);
    }
  }
  plan.copy_from_host_async(plan.labels(), batch.labels.data);
}

}  // namespace rn

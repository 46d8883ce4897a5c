#include "train/batch_feeder.h"

namespace rn {

DType loader_dtype_for(DType input_dtype, const Backend& backend) {
  if (backend.device() != Device::cpu) return DType::u8;
  if (input_dtype == DType::f16) return DType::f32;
  return input_dtype;
}

namespace {
size_t aligned(size_t bytes) { return align_up(bytes, Arena::kAlignment); }
}  // namespace

BatchFeeder::Converter& BatchFeeder::converter_for(Plan& plan, const Batch& batch) {
  const Tensor& images = batch.images;
  Converter& c = converters_[&plan];
  Backend& backend = *plan.backend();
  const Tensor in = plan.input();
  if (c.backend == &backend && c.src == images.dtype && c.input.data == in.data && c.input.shape == in.shape &&
      c.input.dtype == in.dtype && c.input.layout == in.layout)
    return c;
  c = Converter{};
  c.src = images.dtype;
  c.backend = &backend;
  c.input = in;
  if (images.dtype == DType::u8) {
    CropFlipNormalizeDesc d;
    d.batch = in.shape[0], d.channels = in.shape[1], d.out_h = in.shape[2], d.out_w = in.shape[3];
    d.src_h = in.shape[2], d.src_w = in.shape[3];  // crops keep the size; their offsets may reach outside
    d.mean = mean_, d.std = std_;
    d.dtype = in.dtype, d.layout = in.layout;
    c.normalize = backend.make_crop_flip_normalize(d);
    const std::vector<int32_t> identity(static_cast<size_t>(d.batch) * 3, 0);
    c.identity_crops = DeviceBuffer(backend.memory(), identity.size() * sizeof(int32_t));
    backend.memory().copy(c.identity_crops.data(), identity.data(), identity.size() * sizeof(int32_t));
  } else if (images.dtype != in.dtype) {
    RN_CHECK(images.layout == in.layout || images.shape.rank() != 4)
        << "batch " << images.str() << " and the plan's input " << in.str() << " differ in layout";
    c.cast = backend.make_cast({in.numel(), images.dtype, in.dtype});
  }
  if (backend.device() != Device::cpu) {
    c.label_offset = aligned(images.bytes());
    c.crop_offset = c.label_offset + aligned(plan.labels().bytes());
    c.uploader = backend.make_uploader(c.crop_offset + aligned(static_cast<size_t>(in.shape[0]) * 3 * sizeof(int32_t)));
  }
  return c;
}

void BatchFeeder::convert(Plan& plan, Converter& c, const Tensor& images, const Tensor& crops_in) {
  const Tensor in = plan.input();
  if (c.normalize) {
    Tensor x{images.data, {images.numel()}, DType::u8};
    x.device = images.device;
    Tensor crops = crops_in;
    if (!crops.data) {
      crops = Tensor{c.identity_crops.data(), {in.shape[0], 3}, DType::i32};
      crops.device = c.identity_crops.device();
    }
    c.normalize->forward(in, x, crops);
  } else if (c.cast) {
    Tensor flat_in = in, flat_src = images;
    flat_in.shape = {in.numel()};
    flat_src.shape = {in.numel()};
    c.cast->forward(flat_in, flat_src);
  } else {
    plan.copy_from_host_async(in, images.data);  // host or this space -> the input
  }
}

void BatchFeeder::feed(Plan& plan, const Batch& batch) {
  const Tensor in = plan.input();
  const Tensor& images = batch.images;
  RN_CHECK(images.shape == in.shape) << "batch " << images.str() << " does not match the plan's input " << in.str();
  RN_CHECK(images.dtype == in.dtype || images.dtype == DType::u8 || images.layout == in.layout)
      << "batch " << images.str() << " and the plan's input " << in.str() << " differ in layout";
  if (batch.crops.data) {
    RN_CHECK(images.dtype == DType::u8) << "a batch with crops left to the device must be u8, not " << images.str();
    RN_CHECK(batch.crops.dtype == DType::i32 && batch.crops.shape == Shape({in.shape[0], 3}))
        << "batch crops " << batch.crops.str() << ": expected i32 [" << in.shape[0] << ", 3]";
  }
  Converter& c = converter_for(plan, batch);
  if (!c.uploader) {  // host: convert (or copy) straight from the loader's buffers
    convert(plan, c, images, batch.crops);
    plan.copy_from_host_async(plan.labels(), batch.labels.data);
    return;
  }
  auto* staging = static_cast<char*>(c.uploader->begin());
  const Device device = plan.backend()->device();
  Tensor staged = images, crops;
  staged.data = staging;
  staged.device = device;
  c.uploader->copy(staging, images.data, images.bytes());
  c.uploader->copy(staging + c.label_offset, batch.labels.data, plan.labels().bytes());
  if (batch.crops.data) {
    crops = batch.crops;
    crops.data = staging + c.crop_offset;
    crops.device = device;
    c.uploader->copy(crops.data, batch.crops.data, batch.crops.bytes());
  }
  c.uploader->end();
  convert(plan, c, staged, crops);
  plan.copy_from_host_async(plan.labels(), staging + c.label_offset);
  c.uploader->release();
}

}  // namespace rn

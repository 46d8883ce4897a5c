#include "data/transform.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/check.h"
#include "core/dtype.h"

namespace rn {

Rng sample_rng(uint64_t seed, int64_t epoch, int64_t index) {
  constexpr uint64_t kAugmentTag = 0x4175676d656e74ull;  // "Augment"
  return Rng(seed).fork(kAugmentTag).fork(static_cast<uint64_t>(epoch)).fork(static_cast<uint64_t>(index));
}

CropFlipNormalize::CropFlipNormalize(const CropFlipNormalizeOptions& options) : options_(options) {
  RN_CHECK(options.pad >= 0) << "crop padding " << options.pad << " is negative";
  RN_CHECK(options.flip_prob >= 0.0f && options.flip_prob <= 1.0f) << "flip probability " << options.flip_prob;
  const size_t nm = options.mean.size(), ns = options.std.size();
  RN_CHECK(nm >= 1 && ns >= 1) << "normalisation needs at least one mean and one std";
  RN_CHECK(nm == ns || nm == 1 || ns == 1) << "normalisation has " << nm << " means but " << ns << " stds";
  lut_channels_ = static_cast<int>(std::max(nm, ns));
  lut_f32_.resize(static_cast<size_t>(lut_channels_) * 256);
  lut_bf16_.resize(lut_f32_.size());
  for (int c = 0; c < lut_channels_; ++c) {
    const float mean = options.mean[nm == 1 ? 0 : static_cast<size_t>(c)];
    const float std = options.std[ns == 1 ? 0 : static_cast<size_t>(c)];
    RN_CHECK(std > 0.0f && std::isfinite(std)) << "normalisation std " << std << " for channel " << c;
    for (int v = 0; v < 256; ++v) {
      const float x = (static_cast<float>(v) / 255.0f - mean) / std;
      lut_f32_[static_cast<size_t>(c) * 256 + static_cast<size_t>(v)] = x;
      lut_bf16_[static_cast<size_t>(c) * 256 + static_cast<size_t>(v)] = f32_to_bf16(x).bits;
    }
  }
}

SampleGeometry CropFlipNormalize::output_geometry(const SampleGeometry& input) const {
  RN_CHECK(input.fixed()) << name() << " keeps the image size, so it needs fixed-size images, got " << input.str();
  RN_CHECK(lut_channels_ == 1 || lut_channels_ == input.channels)
      << name() << " normalises " << lut_channels_ << " channels but the images have " << input.channels;
  return input;
}

std::string CropFlipNormalize::name() const {
  std::ostringstream s;
  s << "crop_flip_normalize(pad=" << options_.pad << ", flip=" << options_.flip_prob << ")";
  return s.str();
}

// One pass over the output slot. Output pixel (y, x) reads the padded image at
// (y + oy, x' + ox) with x' = W-1-x when flipped, i.e. the raw image at (y + oy - pad,
// x' + ox - pad); outside the raw image it is padding (raw value 0).
template <typename T, bool kNhwc>
void CropFlipNormalize::write(const Sample& sample, int oy, int ox, bool flip, const Tensor& images,
                              int64_t slot) const {
  const int C = sample.channels, H = sample.height, W = sample.width, pad = options_.pad;
  const T* lut = nullptr;
  if constexpr (sizeof(T) == 4) {
    lut = lut_f32_.data();
  } else {
    lut = lut_bf16_.data();
  }
  T* out = images.ptr<T>() + slot * int64_t{C} * H * W;
  const uint8_t* px = sample.pixels.data();
  // Source column of output column x, or -1 for padding; the same for every row and channel.
  int src_x[1024];
  std::vector<int> src_x_heap;
  int* sx = src_x;
  if (W > 1024) {
    src_x_heap.resize(static_cast<size_t>(W));
    sx = src_x_heap.data();
  }
  for (int x = 0; x < W; ++x) {
    const int s = (flip ? W - 1 - x : x) + ox - pad;
    sx[x] = (s >= 0 && s < W) ? s : -1;
  }
  for (int y = 0; y < H; ++y) {
    const int sy = y + oy - pad;
    const bool row_in = sy >= 0 && sy < H;
    const uint8_t* row = px + static_cast<size_t>(row_in ? sy : 0) * static_cast<size_t>(W) * static_cast<size_t>(C);
    if constexpr (kNhwc) {
      T* dst = out + static_cast<int64_t>(y) * W * C;
      for (int x = 0; x < W; ++x) {
        const int s = row_in ? sx[x] : -1;
        for (int c = 0; c < C; ++c) {
          const uint8_t v = s >= 0 ? row[static_cast<size_t>(s) * static_cast<size_t>(C) + static_cast<size_t>(c)] : 0;
          dst[x * C + c] = lut[lut_row(c) + v];
        }
      }
    } else {
      for (int c = 0; c < C; ++c) {
        const T* l = lut + lut_row(c);
        T* dst = out + (static_cast<int64_t>(c) * H + y) * W;
        if (!row_in) {
          std::fill(dst, dst + W, l[0]);
          continue;
        }
        if (C == 1) {
          for (int x = 0; x < W; ++x) dst[x] = l[sx[x] >= 0 ? row[sx[x]] : 0];
        } else {
          for (int x = 0; x < W; ++x) {
            dst[x] =
                l[sx[x] >= 0 ? row[static_cast<size_t>(sx[x]) * static_cast<size_t>(C) + static_cast<size_t>(c)] : 0];
          }
        }
      }
    }
  }
}

void ImageTransform::apply_deferred(const Sample&, Rng&, const Tensor&, int64_t, int32_t*) const {
  RN_FAIL() << name() << " cannot leave its augmentation to the device";
}

void CropFlipNormalize::check_slot(const Sample& sample, const Tensor& images, int64_t slot) const {
  RN_CHECK(images.shape.rank() == 4) << "batch images must be 4-D, got " << images.str();
  RN_CHECK(slot >= 0 && slot < images.shape[0]) << "slot " << slot << " outside batch " << images.str();
  RN_CHECK(sample.channels == images.shape[1] && sample.height == images.shape[2] && sample.width == images.shape[3])
      << "sample of " << sample.channels << "x" << sample.height << "x" << sample.width << " does not fit batch "
      << images.str() << " (" << name() << " keeps the size)";
  RN_CHECK(sample.pixels.size() >= static_cast<size_t>(sample.channels) * sample.height * sample.width)
      << "sample holds " << sample.pixels.size() << " bytes, fewer than its size";
  RN_CHECK(lut_channels_ == 1 || lut_channels_ == sample.channels)
      << name() << " normalises " << lut_channels_ << " channels but the sample has " << sample.channels;
}

void CropFlipNormalize::draw(Rng& rng, int* oy, int* ox, bool* flip) const {
  // Always draw the same numbers, so a sample's stream does not depend on the options.
  const uint64_t window = static_cast<uint64_t>(2 * options_.pad + 1);
  *oy = static_cast<int>(rng.below(window));
  *ox = static_cast<int>(rng.below(window));
  *flip = rng.uniform() < options_.flip_prob;
}

void CropFlipNormalize::apply_deferred(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
                                       int32_t crop[3]) const {
  check_slot(sample, images, slot);
  RN_CHECK(images.dtype == DType::u8 && images.layout == Layout::nhwc)
      << name() << " leaves its work to the device from u8 NHWC batches, not " << images.str();
  int oy = 0, ox = 0;
  bool flip = false;
  draw(rng, &oy, &ox, &flip);
  const size_t n = static_cast<size_t>(sample.channels) * sample.height * sample.width;
  std::copy_n(sample.pixels.data(), n, images.ptr<uint8_t>() + static_cast<size_t>(slot) * n);
  // Output (p, q) reads the raw image at (p + oy - pad, q' + ox - pad), q' mirrored when flipped:
  // a crop at (oy - pad, ox - pad) of the unpadded image, zero outside it.
  crop[0] = oy - options_.pad;
  crop[1] = ox - options_.pad;
  crop[2] = flip ? 1 : 0;
}

void CropFlipNormalize::apply(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
                              TransformScratch& /*scratch*/) const {
  check_slot(sample, images, slot);
  int oy = 0, ox = 0;
  bool flip = false;
  draw(rng, &oy, &ox, &flip);

  const bool nhwc = images.layout == Layout::nhwc;
  switch (images.dtype) {
    case DType::f32:
      nhwc ? write<float, true>(sample, oy, ox, flip, images, slot)
           : write<float, false>(sample, oy, ox, flip, images, slot);
      break;
    case DType::bf16:
      nhwc ? write<uint16_t, true>(sample, oy, ox, flip, images, slot)
           : write<uint16_t, false>(sample, oy, ox, flip, images, slot);
      break;
    default:
      RN_FAIL() << name() << " writes f32 or bf16 batches, not " << dtype_name(images.dtype);
  }
}

std::shared_ptr<CropFlipNormalize> small_image_train_transform(int pad, std::vector<float> mean,
                                                               std::vector<float> std) {
  CropFlipNormalizeOptions o;
  o.pad = pad;
  o.flip_prob = 0.5f;
  o.mean = std::move(mean);
  o.std = std::move(std);
  return std::make_shared<CropFlipNormalize>(o);
}

std::shared_ptr<CropFlipNormalize> small_image_eval_transform(std::vector<float> mean, std::vector<float> std) {
  CropFlipNormalizeOptions o;
  o.mean = std::move(mean);
  o.std = std::move(std);
  return std::make_shared<CropFlipNormalize>(o);
}

}  // namespace rn

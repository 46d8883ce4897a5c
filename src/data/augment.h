// Augmentation for encoded images, planned before decoding: the crop is chosen from the
// image's header size alone, so the decoder only decodes the region the crop needs, at the
// smallest DCT scale that still covers the output size. Rendering (resize with the
// antialiasing filter, flip) writes 8-bit RGB HWC into the batch; normalisation and the cast
// to the compute dtype happen later, per batch (normalize.h) or on the device.
//
// Training: RandomResizedCrop (torchvision's parameters and sampling) then a horizontal flip.
// Evaluation: resize the shorter side to `resize` then take the centre `crop`, as
// torchvision's Resize + CenterCrop; both match PIL's output bit for bit when decoded at full
// scale (dct_scaling off).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/image_codec.h"
#include "data/image_resize.h"

namespace rn {

// What to decode and how to render it.
struct CropPlan {
  DecodeRequest request;  // region in stored pixels and the minimum decoded size
  ResizeWindow window;    // the region is resized to window.full_* and this window kept
  bool flip = false;
};

class ImageAugment {
 public:
  virtual ~ImageAugment() = default;
  virtual int out_width() const = 0;
  virtual int out_height() const = 0;
  // The plan for an image of width x height stored pixels.
  virtual CropPlan plan(int width, int height, Rng& rng) const = 0;
  virtual std::string name() const = 0;
  // false: decode at full resolution (slower; bit-exact with PIL)
  bool dct_scaling = true;
};

struct RandomResizedCropOptions {
  int height = 224;
  int width = 224;
  std::array<double, 2> scale{0.08, 1.0};             // fraction of the image area
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};  // width / height
  float flip_prob = 0.5f;
};

class RandomResizedCrop : public ImageAugment {
 public:
  explicit RandomResizedCrop(const RandomResizedCropOptions& options);
  int out_width() const override { return options_.width; }
  int out_height() const override { return options_.height; }
  CropPlan plan(int width, int height, Rng& rng) const override;
  std::string name() const override;
  const RandomResizedCropOptions& options() const { return options_; }

 private:
  RandomResizedCropOptions options_;
};

struct ResizeCenterCropOptions {
  int resize = 256;  // the shorter side after resizing
  int height = 224;  // the centre crop
  int width = 224;
};

class ResizeCenterCrop : public ImageAugment {
 public:
  explicit ResizeCenterCrop(const ResizeCenterCropOptions& options);
  int out_width() const override { return options_.width; }
  int out_height() const override { return options_.height; }
  CropPlan plan(int width, int height, Rng& rng) const override;
  std::string name() const override;

 private:
  ResizeCenterCropOptions options_;
};

struct AugmentScratch {
  DecodedImage decoded;
  ResizeScratch resize;
};

// The size of a width x height image with its shorter side scaled down to `max_short` and
// the other side in proportion (rounded, at least 1); unchanged when the shorter side is
// already at most max_short, or max_short <= 0.
void fit_shorter_side(int width, int height, int max_short, int* out_w, int* out_h);

// Decodes the whole image with its shorter side at most `max_short` (DCT scaling, then the
// antialiased resize when still larger): RGB HWC into `out`, its size into *w and *h. What
// the packer stores and the decoded-image cache keeps.
void decode_fitted(const EncodedImage& image, int max_short, AugmentScratch& scratch, std::vector<uint8_t>& out, int* w,
                   int* h);

// Renders the plan from an image decoded for it (decoded.region_* locate the plan's region)
// into `out`: out_height x out_width x 3 bytes, rows `out_stride` apart (0: packed).
void render(const DecodedImage& decoded, const CropPlan& plan, uint8_t* out, size_t out_stride, ResizeScratch& scratch);

}  // namespace rn

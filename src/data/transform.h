// Transforms turn one decoded Sample into one slot of a batch: augmentation (random crop,
// flip), normalisation and the cast to the batch's dtype and layout, in one pass over the
// pixels. A transform is const and shared by all loader workers; its randomness comes only
// from the Rng the loader derives for each sample from (seed, epoch, sample index), so a
// batch is the same whatever the number of workers or which worker made it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace rn {

// Per-worker scratch memory a transform may use between samples (a resize buffer, say),
// so that no transform allocates per sample.
struct TransformScratch {
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};

class ImageTransform {
 public:
  virtual ~ImageTransform() = default;

  // What apply() writes for input images of geometry `input`; must be fixed. Throws when
  // the transform cannot take such input (a fixed-size transform given variable images).
  virtual SampleGeometry output_geometry(const SampleGeometry& input) const = 0;
  // Writes `sample` into slot `slot` of `images`: a 4-D host tensor, logical [N, C, H, W]
  // with C, H, W = output_geometry, dtype f32 or bf16, layout nchw or nhwc.
  virtual void apply(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
                     TransformScratch& scratch) const = 0;
  // Device augmentation: writes the sample's pixels as they are into slot `slot` of a u8
  // NHWC batch of the same geometry, and the crop and flip apply() would have made (the
  // same draws from `rng`) into `crop` as (y0, x0, flip) for crop_flip_normalize
  // (ops/augment.h), which then gives what apply() writes. Transforms that cannot leave
  // their work to the device throw rn::Error.
  virtual void apply_deferred(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
                              int32_t crop[3]) const;
  virtual std::string name() const = 0;
};

// The random stream for augmenting dataset sample `index` in `epoch` under `seed`.
Rng sample_rng(uint64_t seed, int64_t epoch, int64_t index);

// Augmentation for small images (Fashion-MNIST, CIFAR): zero-pad by `pad` on every side and
// crop a random window of the original size (pad 0: no crop), flip horizontally with
// probability `flip_prob`, then normalise each channel: (pixel / 255 - mean[c]) / std[c].
// Padding is black (pixel 0) before normalisation, as in torchvision's RandomCrop(padding).
// Evaluation uses pad 0 and flip_prob 0: normalisation only.
struct CropFlipNormalizeOptions {
  int pad = 0;
  float flip_prob = 0.0f;
  std::vector<float> mean{0.0f};  // one value per channel, or one value for every channel
  std::vector<float> std{1.0f};
};

class CropFlipNormalize : public ImageTransform {
 public:
  explicit CropFlipNormalize(const CropFlipNormalizeOptions& options);

  SampleGeometry output_geometry(const SampleGeometry& input) const override;
  void apply(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
             TransformScratch& scratch) const override;
  void apply_deferred(const Sample& sample, Rng& rng, const Tensor& images, int64_t slot,
                      int32_t crop[3]) const override;
  std::string name() const override;

  const CropFlipNormalizeOptions& options() const { return options_; }
  // The normalised value of raw pixel value `v` in channel `c`, as f32.
  float normalized(int c, uint8_t v) const { return lut_f32_[lut_row(c) + v]; }

 private:
  size_t lut_row(int c) const { return lut_channels_ == 1 ? 0 : static_cast<size_t>(c) * 256; }
  void check_slot(const Sample& sample, const Tensor& images, int64_t slot) const;
  // The window offset in the padded image (oy, ox in [0, 2 pad]) and the flip.
  void draw(Rng& rng, int* oy, int* ox, bool* flip) const;
  template <typename T, bool kNhwc>
  void write(const Sample& sample, int oy, int ox, bool flip, const Tensor& images, int64_t slot) const;

  CropFlipNormalizeOptions options_;
  int lut_channels_ = 1;
  std::vector<float> lut_f32_;      // [lut_channels][256]
  std::vector<uint16_t> lut_bf16_;  // the same values rounded to bf16
};

// Training augmentation for small images: random crop with `pad`, flip with p = 0.5, normalise.
std::shared_ptr<CropFlipNormalize> small_image_train_transform(int pad, std::vector<float> mean,
                                                               std::vector<float> std);
// Evaluation: normalise only.
std::shared_ptr<CropFlipNormalize> small_image_eval_transform(std::vector<float> mean, std::vector<float> std);

}  // namespace rn

// Normalisation and the cast to the compute dtype, per batch: uint8 RGB NHWC (what the
// augmentation writes) to f32 or bf16, NCHW or NHWC, (pixel / 255 - mean[c]) / std[c] via a
// lookup table per channel. On a GPU this runs on the device instead, so that only one byte
// per channel crosses the host.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace rn {

class Normalizer {
 public:
  // One mean and std per channel, or one value for all channels; pixels scaled to [0, 1].
  Normalizer(int channels, std::vector<float> mean, std::vector<float> std);

  // Writes images [0, n) of the u8 NHWC batch `src` (n x h x w x channels) into `out`
  // (4-D, logical [>= n, channels, h, w], f32 or bf16, either layout).
  void apply(const uint8_t* src, int64_t n, const Tensor& out) const;
  int channels() const { return channels_; }

 private:
  int channels_;
  std::vector<float> lut_f32_;      // [channels][256]
  std::vector<uint16_t> lut_bf16_;  // the same, rounded to bf16
};

}  // namespace rn

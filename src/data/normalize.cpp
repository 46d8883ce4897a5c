#include "data/normalize.h"

#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace rn {

Normalizer::Normalizer(int channels, std::vector<float> mean, std::vector<float> std) : channels_(channels) {
  RN_CHECK(channels >= 1) << "normalising " << channels << " channels";
  const size_t nm = mean.size(), ns = std.size();
  RN_CHECK((nm == 1 || nm == static_cast<size_t>(channels)) && (ns == 1 || ns == static_cast<size_t>(channels)))
      << "normalisation has " << nm << " means and " << ns << " stds for " << channels
      << " channels (give one value or one per channel)";
  lut_f32_.resize(static_cast<size_t>(channels) * 256);
  lut_bf16_.resize(lut_f32_.size());
  for (int c = 0; c < channels; ++c) {
    const float m = mean[nm == 1 ? 0 : static_cast<size_t>(c)];
    const float s = std[ns == 1 ? 0 : static_cast<size_t>(c)];
    RN_CHECK(s > 0.0f && std::isfinite(s)) << "normalisation std " << s << " for channel " << c;
    for (int v = 0; v < 256; ++v) {
      const float x = (static_cast<float>(v) / 255.0f - m) / s;
      lut_f32_[static_cast<size_t>(c) * 256 + static_cast<size_t>(v)] = x;
      lut_bf16_[static_cast<size_t>(c) * 256 + static_cast<size_t>(v)] = f32_to_bf16(x).bits;
    }
  }
}

namespace {

template <typename T>
void normalize_batch(const uint8_t* src, int64_t n, const Tensor& out, const T* lut, int C) {
  const int64_t H = out.shape[2], W = out.shape[3];
  T* dst = static_cast<T*>(out.data);
  const int64_t pixels = H * W;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* s = src + i * pixels * C;
    if (out.layout == Layout::nhwc) {
      T* d = dst + i * pixels * C;
      for (int64_t p = 0; p < pixels; ++p)
        for (int c = 0; c < C; ++c) d[p * C + c] = lut[c * 256 + s[p * C + c]];
    } else {
      for (int c = 0; c < C; ++c) {
        T* d = dst + (i * C + c) * pixels;
        const T* l = lut + c * 256;
        for (int64_t p = 0; p < pixels; ++p) d[p] = l[s[p * C + c]];
      }
    }
  }
}

}  // namespace

void Normalizer::apply(const uint8_t* src, int64_t n, const Tensor& out) const {
  RN_CHECK(out.shape.rank() == 4 && out.shape[1] == channels_ && out.shape[0] >= n)
      << "normalising " << n << " images of " << channels_ << " channels into a tensor of shape " << out.shape.str();
  if (out.dtype == DType::f32) {
    normalize_batch<float>(src, n, out, lut_f32_.data(), channels_);
  } else {
    RN_CHECK(out.dtype == DType::bf16) << "normalising into " << dtype_name(out.dtype) << ": f32 or bf16 only";
    normalize_batch<uint16_t>(src, n, out, lut_bf16_.data(), channels_);
  }
}

}  // namespace rn

#include "ops/augment.h"

#include <cmath>
#include <sstream>

#include "ops/check_tensor.h"
#include "ops/fused_math.h"

namespace rn {

void CropFlipNormalizeDesc::validate() const {
  RN_CHECK(batch > 0 && channels > 0 && src_h > 0 && src_w > 0 && out_h > 0 && out_w > 0)
      << "crop_flip_normalize: empty shape in " << str();
  const auto n = static_cast<size_t>(channels);
  RN_CHECK((mean.size() == 1 || mean.size() == n) && (std.size() == 1 || std.size() == n))
      << "crop_flip_normalize: " << mean.size() << " means and " << std.size() << " stds for " << channels
      << " channels (give one value or one per channel)";
  for (float s : std) RN_CHECK(s > 0.0f && std::isfinite(s)) << "crop_flip_normalize: std " << s;
  RN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16)
      << "crop_flip_normalize: output dtype must be floating in " << str();
}

std::string CropFlipNormalizeDesc::str() const {
  std::ostringstream s;
  s << "crop_flip_normalize(u8 " << batch << "x" << src_h << "x" << src_w << "x" << channels << " -> "
    << dtype_name(dtype) << " " << layout_name(layout) << " " << out_h << "x" << out_w << ")";
  return s.str();
}

void CropFlipNormalizeKernel::forward(const Tensor& y, const Tensor& x, const Tensor& crops) {
  const auto op = desc_.str();
  check_tensor(y, desc_.y_shape(), desc_.dtype, desc_.layout, "y", op);
  RN_CHECK(x.dtype == DType::u8 && x.numel() == desc_.x_shape().numel() && x.data)
      << op << ": x must be u8 with " << desc_.x_shape().numel() << " elements, got " << x.str();
  check_tensor(crops, {desc_.batch, 3}, DType::i32, "crops", op);
  do_forward(y, x, crops);
}

namespace {
class HostCropFlipNormalize final : public CropFlipNormalizeKernel {
 public:
  using CropFlipNormalizeKernel::CropFlipNormalizeKernel;

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& crops) override {
    const CropFlipNormalizeDesc& d = desc_;
    const uint8_t* src = x.ptr<uint8_t>();
    const int32_t* cr = crops.ptr<int32_t>();
    for (int64_t n = 0; n < d.batch; ++n) {
      const int64_t y0 = cr[n * 3], x0 = cr[n * 3 + 1];
      const bool flip = cr[n * 3 + 2] != 0;
      for (int64_t p = 0; p < d.out_h; ++p)
        for (int64_t q = 0; q < d.out_w; ++q) {
          const int64_t sy = y0 + p, sx = fused::crop_flip_source_x(q, x0, d.out_w, flip);
          const bool inside = sy >= 0 && sy < d.src_h && sx >= 0 && sx < d.src_w;
          for (int64_t c = 0; c < d.channels; ++c) {
            const uint8_t v = inside ? src[((n * d.src_h + sy) * d.src_w + sx) * d.channels + c] : 0;
            const float f = fused::normalize_u8(v, d.mean_of(c), d.std_of(c));
            convert(static_cast<char*>(y.data) + y.offset(n, c, p, q) * static_cast<int64_t>(dtype_size(d.dtype)),
                    d.dtype, &f, DType::f32, 1);
          }
        }
    }
  }
};
}  // namespace

std::unique_ptr<CropFlipNormalizeKernel> make_host_crop_flip_normalize(const CropFlipNormalizeDesc& d) {
  d.validate();
  return std::make_unique<HostCropFlipNormalize>(d);
}

}  // namespace rn

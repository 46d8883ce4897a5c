// crop_flip_normalize: the last step of the input pipeline, done where the model runs. From a
// uint8 NHWC batch x[N, src_h, src_w, C] (what the loader writes for image datasets), per image
// n a crop of out_h x out_w at (y0[n], x0[n]) (pixels outside the source read as 0, as with
// a zero-padded RandomCrop), mirrored horizontally when flip[n], normalised per channel as
// (v / 255 - mean[c]) / std[c] (data/normalize.h's arithmetic, fused::normalize_u8) and
// written in the compute dtype and layout:
//   y[n, c, p, q] = normalize(x[n, y0 + p, crop_flip_source_x(q, x0, out_w, flip), c])
// crops: int32 [N, 3] = (y0, x0, flip). The default implementation runs on the host; a device
// backend runs it as one kernel so only one byte per channel crosses to the device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace rn {

struct CropFlipNormalizeDesc {
  int64_t batch = 1, channels = 3, src_h = 1, src_w = 1, out_h = 1, out_w = 1;
  std::vector<float> mean, std;                                      // one per channel, or one for all
  DType dtype = DType::f32;                                          // of y
  Layout layout = Layout::nhwc;                                      // of y
  Shape x_shape() const { return {batch, src_h, src_w, channels}; }  // dense NHWC u8
  Shape y_shape() const { return {batch, channels, out_h, out_w}; }
  void validate() const;
  std::string str() const;
  float mean_of(int64_t c) const { return mean.size() == 1 ? mean[0] : mean[static_cast<size_t>(c)]; }
  float std_of(int64_t c) const { return std.size() == 1 ? std[0] : std[static_cast<size_t>(c)]; }
};

class CropFlipNormalizeKernel {
 public:
  explicit CropFlipNormalizeKernel(const CropFlipNormalizeDesc& d) : desc_(d) {}
  virtual ~CropFlipNormalizeKernel() = default;
  const CropFlipNormalizeDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& x, const Tensor& crops);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x, const Tensor& crops) = 0;
  CropFlipNormalizeDesc desc_;
};

// The host implementation (plain loops over fused::normalize_u8 / crop_flip_source_x).
std::unique_ptr<CropFlipNormalizeKernel> make_host_crop_flip_normalize(const CropFlipNormalizeDesc& d);

}  // namespace rn

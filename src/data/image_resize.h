// Antialiased resampling of 8-bit images, matching PIL's (and so torchvision's) bilinear
// filter: when shrinking, the triangle filter is widened by the scale factor so that every
// source pixel contributes (no aliasing). The source box is given in floating-point pixel
// coordinates, so a crop and a resize are one operation, as in PIL's resize(size, box).
// Separable: a horizontal pass into a row buffer, then a vertical pass, with coefficients
// computed once per call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rn {

struct ResizeBox {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // source region, x1 > x0, y1 > y0
};

// Reused between calls so that resizing never allocates in steady state.
struct ResizeScratch {
  std::vector<int32_t> coeffs;
  std::vector<int32_t> bounds;
  std::vector<uint8_t> rows;
};

struct ImageView {
  const uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  size_t stride = 0;  // bytes per row; 0: width * channels
};

// Resamples `box` of `src` to dst_width x dst_height pixels of src.channels channels, rows
// `dst_stride` bytes apart (0: packed), mirrored left-right when `flip`.
void resize_bilinear_aa(const ImageView& src, const ResizeBox& box, uint8_t* dst, int dst_width, int dst_height,
                        size_t dst_stride, bool flip, ResizeScratch& scratch);

}  // namespace rn

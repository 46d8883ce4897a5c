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
  std::vector<int32_t> acc;
};

struct ImageView {
  const uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  size_t stride = 0;  // bytes per row; 0: width * channels
};

// Resamples `box` of `src` to dst_width x dst_height pixels of src.channels channels, rows
// `dst_stride` bytes apart (0: packed), mirrored left-right when `flip`. Only pixels inside
// the box (widened to whole pixels) are read, as when PIL resizes an image cropped to it.
void resize_bilinear_aa(const ImageView& src, const ResizeBox& box, uint8_t* dst, int dst_width, int dst_height,
                        size_t dst_stride, bool flip, ResizeScratch& scratch);

// The same, computing only a window of the resized image: `box` is resized to
// full_width x full_height and the window_width x window_height pixels at (window_x,
// window_y) of that result are written (resize-then-centre-crop in one pass).
struct ResizeWindow {
  int full_width = 0, full_height = 0;
  int x = 0, y = 0, width = 0, height = 0;
};
void resize_bilinear_aa(const ImageView& src, const ResizeBox& box, const ResizeWindow& window, uint8_t* dst,
                        size_t dst_stride, bool flip, ResizeScratch& scratch);

}  // namespace rn

#include "data/image_resize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace rn {

namespace {

// Fixed-point coefficients with 22 fractional bits, as PIL uses for 8-bit images: a sum of
// 255-valued pixels times normalised weights stays below 2^31.
constexpr int kPrecisionBits = 22;

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// One axis: for each output index in [window, window + count) of a resize of the box
// [b0, b1) to `full` pixels, the first source index (bounds[2i]), the tap count
// (bounds[2i + 1]) and `ksize` fixed-point weights. Source indices are limited to
// [lo, hi), the box widened to whole pixels. Returns ksize.
int axis_coeffs(double b0, double b1, int lo, int hi, int full, int window, int count, std::vector<int32_t>& coeffs,
                std::vector<int32_t>& bounds, size_t coeff_base, size_t bound_base) {
  const double scale = (b1 - b0) / full;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  coeffs.resize(coeff_base + static_cast<size_t>(count) * ksize);
  bounds.resize(bound_base + static_cast<size_t>(count) * 2);
  std::vector<double> k(static_cast<size_t>(ksize));
  const int in_size = hi - lo;
  const double box0 = b0 - lo;
  for (int i = 0; i < count; ++i) {
    const double center = box0 + (window + i + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    xmax = std::min(xmax, ksize);
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    int32_t* kk = coeffs.data() + coeff_base + static_cast<size_t>(i) * ksize;
    for (int x = 0; x < ksize; ++x) {
      const double w = x < xmax ? (ww != 0.0 ? k[static_cast<size_t>(x)] / ww : 0.0) : 0.0;
      const double f = w * (1 << kPrecisionBits);
      kk[x] = static_cast<int32_t>(w < 0 ? std::trunc(-0.5 + f) : std::trunc(0.5 + f));
    }
    bounds[bound_base + static_cast<size_t>(i) * 2] = xmin + lo;
    bounds[bound_base + static_cast<size_t>(i) * 2 + 1] = std::max(xmax, 0);
  }
  return ksize;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One row: each output pixel is a short dot product over neighbouring source pixels. The
// three-channel case keeps the channels' sums together so that every source pixel is read
// once.
void horizontal3(const uint8_t* src, uint8_t* dst, int count, const int32_t* coeffs, const int32_t* bounds, int ksize,
                 bool flip) {
  for (int i = 0; i < count; ++i) {
    const int xmin = bounds[2 * i], n = bounds[2 * i + 1];
    const int32_t* k = coeffs + static_cast<size_t>(i) * ksize;
    const uint8_t* s = src + static_cast<size_t>(xmin) * 3;
    int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
    for (int x = 0; x < n; ++x, s += 3) {
      const int32_t w = k[x];
      a0 += s[0] * w;
      a1 += s[1] * w;
      a2 += s[2] * w;
    }
    uint8_t* d = dst + static_cast<size_t>(flip ? count - 1 - i : i) * 3;
    d[0] = clip8(a0);
    d[1] = clip8(a1);
    d[2] = clip8(a2);
  }
}

// One output row of the vertical pass: a weighted sum of n rows of the intermediate.
void vertical_row(const uint8_t* rows, size_t stride, int n, const int32_t* k, int32_t* acc, int len,
                            uint8_t* d) {
  for (int x = 0; x < len; ++x) acc[x] = 1 << (kPrecisionBits - 1);
  for (int y = 0; y < n; ++y) {
    const uint8_t* t = rows + stride * static_cast<size_t>(y);
    const int32_t w = k[y];
    for (int x = 0; x < len; ++x) acc[x] += t[x] * w;
  }
  for (int x = 0; x < len; ++x) d[x] = clip8(acc[x]);
}

void horizontal(const uint8_t* src, uint8_t* dst, int count, const int32_t* coeffs, const int32_t* bounds, int ksize,
                bool flip, int nc) {
  for (int i = 0; i < count; ++i) {
    const int xmin = bounds[2 * i], n = bounds[2 * i + 1];
    const int32_t* k = coeffs + static_cast<size_t>(i) * ksize;
    const uint8_t* s = src + static_cast<size_t>(xmin) * nc;
    uint8_t* d = dst + static_cast<size_t>(flip ? count - 1 - i : i) * nc;
    for (int c = 0; c < nc; ++c) {
      int32_t acc = 1 << (kPrecisionBits - 1);
      for (int x = 0; x < n; ++x) acc += s[x * nc + c] * k[x];
      d[c] = clip8(acc);
    }
  }
}

}  // namespace

void resize_bilinear_aa(const ImageView& src, const ResizeBox& box, const ResizeWindow& window, uint8_t* dst,
                        size_t dst_stride, bool flip, ResizeScratch& scratch) {
  RN_CHECK(src.data != nullptr && src.width > 0 && src.height > 0 && src.channels > 0)
      << "resize of an empty " << src.width << "x" << src.height << " image";
  RN_CHECK(box.x0 >= 0 && box.y0 >= 0 && box.x1 > box.x0 && box.y1 > box.y0 && box.x1 <= src.width + 1e-3f &&
           box.y1 <= src.height + 1e-3f)
      << "resize box (" << box.x0 << ", " << box.y0 << ")-(" << box.x1 << ", " << box.y1 << ") outside the "
      << src.width << "x" << src.height << " image";
  RN_CHECK(window.full_width > 0 && window.full_height > 0 && window.width > 0 && window.height > 0 && window.x >= 0 &&
           window.y >= 0 && window.x + window.width <= window.full_width &&
           window.y + window.height <= window.full_height)
      << "resize window " << window.width << "x" << window.height << "+" << window.x << "+" << window.y << " outside "
      << window.full_width << "x" << window.full_height;
  const int nc = src.channels;
  const size_t src_stride = src.stride ? src.stride : static_cast<size_t>(src.width) * nc;
  const size_t out_stride = dst_stride ? dst_stride : static_cast<size_t>(window.width) * nc;

  // The box widened to whole pixels is the "image" the filter may read.
  const int xlo = static_cast<int>(std::floor(box.x0)), ylo = static_cast<int>(std::floor(box.y0));
  const int xhi = std::min(src.width, static_cast<int>(std::ceil(box.x1 - 1e-4f)));
  const int yhi = std::min(src.height, static_cast<int>(std::ceil(box.y1 - 1e-4f)));
  const int kx = axis_coeffs(box.x0, std::min<double>(box.x1, xhi), xlo, std::max(xhi, xlo + 1), window.full_width,
                             window.x, window.width, scratch.coeffs, scratch.bounds, 0, 0);
  const size_t ycoeff_base = scratch.coeffs.size(), ybound_base = scratch.bounds.size();
  const int ky = axis_coeffs(box.y0, std::min<double>(box.y1, yhi), ylo, std::max(yhi, ylo + 1), window.full_height,
                             window.y, window.height, scratch.coeffs, scratch.bounds, ycoeff_base, ybound_base);
  const int32_t* xc = scratch.coeffs.data();
  const int32_t* xb = scratch.bounds.data();
  const int32_t* yc = scratch.coeffs.data() + ycoeff_base;
  const int32_t* yb = scratch.bounds.data() + ybound_base;

  // Source rows the vertical pass reads.
  int row0 = yb[0], row1 = yb[0] + yb[1];
  for (int i = 0; i < window.height; ++i) {
    row0 = std::min(row0, yb[2 * i]);
    row1 = std::max(row1, yb[2 * i] + yb[2 * i + 1]);
  }
  const size_t tmp_stride = static_cast<size_t>(window.width) * nc;
  scratch.rows.resize(tmp_stride * static_cast<size_t>(std::max(row1 - row0, 1)));
  for (int y = row0; y < row1; ++y) {
    const uint8_t* s = src.data + src_stride * static_cast<size_t>(y);
    uint8_t* t = scratch.rows.data() + tmp_stride * static_cast<size_t>(y - row0);
    if (nc == 3) {
      horizontal3(s, t, window.width, xc, xb, kx, flip);
    } else {
      horizontal(s, t, window.width, xc, xb, kx, flip, nc);
    }
  }
  // Vertical pass: whole rows at a time so that the inner loop runs over contiguous bytes.
  const int row_len = window.width * nc;
  scratch.acc.resize(static_cast<size_t>(row_len));
  for (int i = 0; i < window.height; ++i) {
    const int ymin = yb[2 * i] - row0, n = yb[2 * i + 1];
    vertical_row(scratch.rows.data() + tmp_stride * static_cast<size_t>(ymin), tmp_stride, n,
                 yc + static_cast<size_t>(i) * ky, scratch.acc.data(), row_len, dst + out_stride * static_cast<size_t>(i));
  }
}

void resize_bilinear_aa(const ImageView& src, const ResizeBox& box, uint8_t* dst, int dst_width, int dst_height,
                        size_t dst_stride, bool flip, ResizeScratch& scratch) {
  ResizeWindow window;
  window.full_width = window.width = dst_width;
  window.full_height = window.height = dst_height;
  resize_bilinear_aa(src, box, window, dst, dst_stride, flip, scratch);
}

}  // namespace rn

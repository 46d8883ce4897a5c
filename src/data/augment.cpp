#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/check.h"

namespace rn {

namespace {
// Python's round(): halves go to the even neighbour (torchvision computes crops with it).
long py_round(double v) { return std::lrint(std::nearbyint(v)); }
}  // namespace

RandomResizedCrop::RandomResizedCrop(const RandomResizedCropOptions& o) : options_(o) {
  RN_CHECK(o.height > 0 && o.width > 0) << "RandomResizedCrop size " << o.height << "x" << o.width;
  RN_CHECK(o.scale[0] > 0 && o.scale[0] <= o.scale[1] && o.scale[1] <= 1.0)
      << "RandomResizedCrop scale [" << o.scale[0] << ", " << o.scale[1] << "] must satisfy 0 < min <= max <= 1";
  RN_CHECK(o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1])
      << "RandomResizedCrop ratio [" << o.ratio[0] << ", " << o.ratio[1] << "] must satisfy 0 < min <= max";
  RN_CHECK(o.flip_prob >= 0 && o.flip_prob <= 1) << "flip probability " << o.flip_prob;
}

// torchvision's RandomResizedCrop.get_params: ten tries at a random area and log-uniform
// aspect ratio, then a centre crop clamped to the ratio range.
CropPlan RandomResizedCrop::plan(int width, int height, Rng& rng) const {
  const double area = static_cast<double>(width) * height;
  const double log_r0 = std::log(options_.ratio[0]), log_r1 = std::log(options_.ratio[1]);
  int w = 0, h = 0, x = 0, y = 0;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * (options_.scale[0] + (options_.scale[1] - options_.scale[0]) * rng.uniform());
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * rng.uniform());
    w = static_cast<int>(py_round(std::sqrt(target * aspect)));
    h = static_cast<int>(py_round(std::sqrt(target / aspect)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      y = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
      x = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
      found = true;
    }
  }
  if (!found) {
    const double in_ratio = static_cast<double>(width) / height;
    if (in_ratio < options_.ratio[0]) {
      w = width;
      h = std::max(1, static_cast<int>(py_round(w / options_.ratio[0])));
    } else if (in_ratio > options_.ratio[1]) {
      h = height;
      w = std::max(1, static_cast<int>(py_round(h * options_.ratio[1])));
    } else {
      w = width;
      h = height;
    }
    h = std::min(h, height);
    w = std::min(w, width);
    y = (height - h) / 2;
    x = (width - w) / 2;
  }
  CropPlan p;
  p.request.x = x;
  p.request.y = y;
  p.request.width = w;
  p.request.height = h;
  if (dct_scaling) {
    p.request.min_width = options_.width;
    p.request.min_height = options_.height;
  }
  p.window.full_width = p.window.width = options_.width;
  p.window.full_height = p.window.height = options_.height;
  p.flip = options_.flip_prob > 0 && rng.uniform() < options_.flip_prob;
  return p;
}

std::string RandomResizedCrop::name() const {
  std::ostringstream s;
  s << "RandomResizedCrop(" << options_.height << "x" << options_.width << ", scale [" << options_.scale[0] << ", "
    << options_.scale[1] << "], ratio [" << options_.ratio[0] << ", " << options_.ratio[1] << "], flip p "
    << options_.flip_prob << (dct_scaling ? ", DCT scaling" : "") << ")";
  return s.str();
}

ResizeCenterCrop::ResizeCenterCrop(const ResizeCenterCropOptions& o) : options_(o) {
  RN_CHECK(o.resize > 0 && o.height > 0 && o.width > 0)
      << "resize " << o.resize << ", centre crop " << o.height << "x" << o.width;
  RN_CHECK(o.height <= o.resize && o.width <= o.resize)
      << "centre crop " << o.height << "x" << o.width << " larger than the resized shorter side " << o.resize;
}

// torchvision's Resize(int) keeps the aspect ratio with the long side truncated, and
// CenterCrop rounds the offsets.
CropPlan ResizeCenterCrop::plan(int width, int height, Rng&) const {
  int nw = 0, nh = 0;
  if (width <= height) {
    nw = options_.resize;
    nh = static_cast<int>(static_cast<int64_t>(options_.resize) * height / width);
  } else {
    nh = options_.resize;
    nw = static_cast<int>(static_cast<int64_t>(options_.resize) * width / height);
  }
  CropPlan p;
  p.request.x = p.request.y = 0;
  p.request.width = width;
  p.request.height = height;
  if (dct_scaling) {
    p.request.min_width = nw;
    p.request.min_height = nh;
  }
  p.window.full_width = nw;
  p.window.full_height = nh;
  p.window.width = std::min(options_.width, nw);
  p.window.height = std::min(options_.height, nh);
  p.window.x = static_cast<int>(py_round((nw - options_.width) / 2.0));
  p.window.y = static_cast<int>(py_round((nh - options_.height) / 2.0));
  p.flip = false;
  return p;
}

std::string ResizeCenterCrop::name() const {
  std::ostringstream s;
  s << "Resize(" << options_.resize << ") + CenterCrop(" << options_.height << "x" << options_.width << ")"
    << (dct_scaling ? " with DCT scaling" : "");
  return s.str();
}

void fit_shorter_side(int width, int height, int max_short, int* out_w, int* out_h) {
  *out_w = width;
  *out_h = height;
  const int shorter = std::min(width, height);
  if (max_short <= 0 || shorter <= max_short) return;
  const double scale = static_cast<double>(max_short) / shorter;
  if (width <= height) {
    *out_w = max_short;
    *out_h = std::max(1, static_cast<int>(std::lround(height * scale)));
  } else {
    *out_h = max_short;
    *out_w = std::max(1, static_cast<int>(std::lround(width * scale)));
  }
}

void decode_fitted(const EncodedImage& image, int max_short, AugmentScratch& scratch, std::vector<uint8_t>& out, int* w,
                   int* h) {
  const ImageInfo info = image_info(image);
  fit_shorter_side(info.width, info.height, max_short, w, h);
  DecodeRequest request;
  request.min_width = *w;
  request.min_height = *h;
  decode_image(image, request, scratch.decoded);
  const DecodedImage& d = scratch.decoded;
  const size_t bytes = static_cast<size_t>(*w) * static_cast<size_t>(*h) * 3;
  if (d.width == *w && d.height == *h) {
    out.assign(d.pixels.begin(), d.pixels.begin() + static_cast<std::ptrdiff_t>(bytes));
    return;
  }
  out.resize(bytes);
  resize_bilinear_aa(ImageView{d.pixels.data(), d.width, d.height, 3, 0},
                     ResizeBox{d.region_x0, d.region_y0, d.region_x1, d.region_y1}, out.data(), *w, *h, 0, false,
                     scratch.resize);
}

void render(const DecodedImage& d, const CropPlan& plan, uint8_t* out, size_t out_stride, ResizeScratch& scratch) {
  const ImageView src{d.pixels.data(), d.width, d.height, 3, 0};
  const ResizeBox box{d.region_x0, d.region_y0, d.region_x1, d.region_y1};
  resize_bilinear_aa(src, box, plan.window, out, out_stride, plan.flip, scratch);
}

}  // namespace rn

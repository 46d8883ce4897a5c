#include "data/image_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <turbojpeg.h>

#include "core/check.h"

namespace rn {

std::string_view codec_name(ImageCodec codec) {
  switch (codec) {
    case ImageCodec::jpeg:
      return "jpeg";
    case ImageCodec::png:
      return "png";
    case ImageCodec::raw:
      return "raw";
    case ImageCodec::unknown:
      break;
  }
  return "unknown";
}

ImageCodec sniff_codec(std::span<const uint8_t> b) {
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageCodec::jpeg;
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return ImageCodec::png;
  return ImageCodec::unknown;
}

namespace {

// ---------------------------------------------------------------------------------------
// JPEG through the libjpeg API (libjpeg-turbo): the TurboJPEG API of Debian 12's 2.1 has
// no region-of-interest decoding, which is where most of the decode time of a random crop
// is saved. libjpeg reports errors by calling error_exit, which must not return: we
// longjmp back. Everything between setjmp and a possible longjmp is plain C (no object
// with a destructor lives in decode_jpeg_c's frame), so no destructor is ever skipped.

struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings: most (extraneous bytes before a marker, say) leave a correct image and PIL
// accepts them too; running out of data does not (libjpeg pads the rest with grey), so a
// truncated file is an error, not an image with a grey bottom.
extern "C" void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  if (cinfo->err->msg_code == JWRN_JPEG_EOF || cinfo->err->msg_code == JWRN_HIT_MARKER) {
    (*cinfo->err->format_message)(cinfo, err->message);
    std::strncat(err->message, " (truncated file)", sizeof(err->message) - std::strlen(err->message) - 1);
    std::longjmp(err->jump, 1);
  }
  cinfo->err->num_warnings++;
}

struct JpegHeader {
  int width, height, components;
  J_COLOR_SPACE color_space;
  bool adobe;
};

// The smallest n in {1, 2, 4, 8} such that decoding at n/8 keeps a region of w x h stored pixels at
// least min_w x min_h (libjpeg rounds scaled sizes up). A minimum of 0 asks for full size.
// Only the scales libjpeg-turbo has SIMD inverse DCTs for (1/8, 1/4, 1/2, 1/1): the others
// (3/8, 5/8, ...) use plain C and decode slower than full size (measured: 0.54 ms against
// 0.38 ms for a typical 500x375 crop).
int jpeg_scale_num(int w, int h, int min_w, int min_h) {
  if (min_w <= 0 || min_h <= 0) return 8;
  for (int n : {1, 2, 4}) {
    const int64_t sw = (int64_t{w} * n + 7) / 8;
    const int64_t sh = (int64_t{h} * n + 7) / 8;
    // Demand a margin of one pixel: the region's edges fall between scaled pixels.
    if (sw >= min_w + 1 && sh >= min_h + 1) return n;
  }
  return 8;
}

// What decode_jpeg_c needs and gives back; the pixel buffer is grown through a callback so
// that the C++ vector lives outside the setjmp frame.
struct JpegJob {
  const uint8_t* data;
  size_t size;
  DecodeRequest request;
  // out
  JpegHeader header;
  int scale_num;
  int out_x, out_y, out_w, out_h;  // decoded rectangle inside the scaled image
  int scaled_w, scaled_h;
  uint8_t* (*reserve)(void* ctx, size_t bytes);
  void* reserve_ctx;
  uint8_t* cmyk_row;  // scratch row for CMYK (4 * scaled width), from reserve_row
  uint8_t* (*reserve_row)(void* ctx, size_t bytes);
  char message[JMSG_LENGTH_MAX];
};

inline uint8_t muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

// CMYK to RGB as PIL converts it (R = (255 - K) - C * (255 - K) / 255, rounded), after
// undoing Adobe's inverted storage (PIL assumes it for every CMYK JPEG, marker or not).
void cmyk_row_to_rgb(const uint8_t* in, uint8_t* out, int n, bool inverted) {
  for (int i = 0; i < n; ++i, in += 4, out += 3) {
    int c = in[0], m = in[1], y = in[2], k = in[3];
    if (inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    const int nk = 255 - k;
    out[0] = static_cast<uint8_t>(nk - muldiv255(c, nk));
    out[1] = static_cast<uint8_t>(nk - muldiv255(m, nk));
    out[2] = static_cast<uint8_t>(nk - muldiv255(y, nk));
  }
}

// 0 on success, 1 on a libjpeg error (job->message says what). header_only stops after the
// header.
int decode_jpeg_c(JpegJob* job, bool header_only) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_on_error;
  err.pub.emit_message = jpeg_on_message;
  err.message[0] = '\0';
  jpeg_create_decompress(&cinfo);
  if (setjmp(err.jump)) {
    std::memcpy(job->message, err.message, sizeof(job->message));
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  jpeg_mem_src(&cinfo, job->data, static_cast<unsigned long>(job->size));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 14, 0);  // so that saw_Adobe_marker is set
  jpeg_read_header(&cinfo, TRUE);
  job->header.width = static_cast<int>(cinfo.image_width);
  job->header.height = static_cast<int>(cinfo.image_height);
  job->header.components = cinfo.num_components;
  job->header.color_space = cinfo.jpeg_color_space;
  job->header.adobe = cinfo.saw_Adobe_marker;
  if (header_only) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }

  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  DecodeRequest& r = job->request;
  const int n = jpeg_scale_num(r.width, r.height, r.min_width, r.min_height);
  cinfo.scale_num = static_cast<unsigned>(n);
  cinfo.scale_denom = 8;
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  job->scale_num = n;
  job->scaled_w = static_cast<int>(cinfo.output_width);
  job->scaled_h = static_cast<int>(cinfo.output_height);

  // The requested region in scaled pixels, widened to whole pixels and then by a margin:
  // chroma upsampling at the edge of a partial decode replicates instead of interpolating,
  // so the outermost rows and columns of a cropped decode differ from a full decode. With
  // the margin, every pixel of the region is exactly what a full decode gives.
  constexpr int kMargin = 2;
  int x0 = std::max(0, static_cast<int>((int64_t{r.x} * n) / 8) - kMargin);
  int y0 = std::max(0, static_cast<int>((int64_t{r.y} * n) / 8) - kMargin);
  int x1 = std::min(job->scaled_w, static_cast<int>((int64_t{r.x + r.width} * n + 7) / 8) + kMargin);
  int y1 = std::min(job->scaled_h, static_cast<int>((int64_t{r.y + r.height} * n + 7) / 8) + kMargin);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0);
  JDIMENSION width = static_cast<JDIMENSION>(x1 - x0);
  if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &width);  // widens to iMCU columns
  job->out_x = static_cast<int>(xoff);
  job->out_w = static_cast<int>(width);
  job->out_y = y0;
  job->out_h = y1 - y0;

  const size_t out_row = static_cast<size_t>(width) * 3;
  uint8_t* pixels = job->reserve(job->reserve_ctx, out_row * static_cast<size_t>(job->out_h));
  uint8_t* cmyk_row = cmyk ? job->reserve_row(job->reserve_ctx, static_cast<size_t>(width) * 4) : nullptr;
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  for (int row = 0; row < job->out_h; ++row) {
    uint8_t* dst = pixels + out_row * static_cast<size_t>(row);
    JSAMPROW line = cmyk ? cmyk_row : dst;
    if (jpeg_read_scanlines(&cinfo, &line, 1) != 1) {
      std::snprintf(job->message, sizeof(job->message), "decoder stopped at row %d of %d", y0 + row, y1);
      jpeg_destroy_decompress(&cinfo);
      return 1;
    }
    if (cmyk) cmyk_row_to_rgb(cmyk_row, dst, static_cast<int>(width), /*inverted=*/true);
  }
  // The rows below the region are never decoded.
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

struct JpegBuffers {
  std::vector<uint8_t>* pixels;
  std::vector<uint8_t> row;
};

uint8_t* reserve_pixels(void* ctx, size_t bytes) {
  auto* b = static_cast<JpegBuffers*>(ctx);
  b->pixels->resize(bytes);
  return b->pixels->data();
}

uint8_t* reserve_row(void* ctx, size_t bytes) {
  auto* b = static_cast<JpegBuffers*>(ctx);
  b->row.resize(bytes);
  return b->row.data();
}

void check_region(const DecodeRequest& r, int width, int height) {
  RN_CHECK(r.width > 0 && r.height > 0 && r.x >= 0 && r.y >= 0 && r.x + r.width <= width && r.y + r.height <= height)
      << "decode region " << r.width << "x" << r.height << "+" << r.x << "+" << r.y << " outside the " << width << "x"
      << height << " image";
}

DecodeRequest full_region(const DecodeRequest& request, int width, int height) {
  DecodeRequest r = request;
  if (r.width == 0) {
    r.x = r.y = 0;
    r.width = width;
    r.height = height;
  }
  check_region(r, width, height);
  return r;
}

constexpr int kMaxSide = 1 << 16;          // JPEG's limit; PNGs larger than this are refused too
constexpr int64_t kMaxPixels = 1ll << 28;  // 268 Mpixel: more is an attack or a mistake, not a photo

void check_size(ImageCodec codec, int w, int h) {
  RN_CHECK(w > 0 && h > 0 && w <= kMaxSide && h <= kMaxSide && int64_t{w} * h <= kMaxPixels)
      << codec_name(codec) << " image of " << w << "x" << h << " pixels is "
      << (w <= 0 || h <= 0
              ? "empty"
              : fmt::format("too large (the limits: {} pixels a side, {} pixels in all)", kMaxSide, kMaxPixels));
}

ImageInfo jpeg_info(std::span<const uint8_t> bytes) {
  JpegJob job{};
  job.data = bytes.data();
  job.size = bytes.size();
  if (decode_jpeg_c(&job, true) != 0) RN_FAIL() << "bad JPEG: " << job.message;
  ImageInfo info;
  info.codec = ImageCodec::jpeg;
  info.width = job.header.width;
  info.height = job.header.height;
  info.channels = job.header.components;
  check_size(info.codec, info.width, info.height);
  return info;
}

void decode_jpeg(std::span<const uint8_t> bytes, const DecodeRequest& request, DecodedImage& out) {
  const ImageInfo info = jpeg_info(bytes);
  JpegBuffers buffers{&out.pixels, {}};
  JpegJob job{};
  job.data = bytes.data();
  job.size = bytes.size();
  job.request = full_region(request, info.width, info.height);
  job.reserve = reserve_pixels;
  job.reserve_row = reserve_row;
  job.reserve_ctx = &buffers;
  if (decode_jpeg_c(&job, false) != 0) RN_FAIL() << "bad JPEG: " << job.message;
  const DecodeRequest& r = job.request;
  const float s = static_cast<float>(job.scale_num) / 8.0f;
  out.width = job.out_w;
  out.height = job.out_h;
  out.region_x0 = static_cast<float>(r.x) * s - static_cast<float>(job.out_x);
  out.region_y0 = static_cast<float>(r.y) * s - static_cast<float>(job.out_y);
  out.region_x1 =
      std::min(static_cast<float>(r.x + r.width) * s - static_cast<float>(job.out_x), static_cast<float>(job.out_w));
  out.region_y1 =
      std::min(static_cast<float>(r.y + r.height) * s - static_cast<float>(job.out_y), static_cast<float>(job.out_h));
  out.scale_num = job.scale_num;
  out.scale_denom = 8;
  out.full_width = info.width;
  out.full_height = info.height;
}

// ---------------------------------------------------------------------------------------
// PNG through libpng's simplified API (no setjmp on our side; errors come back as a
// message). 8-bit images are read as they are; 16-bit ones as 16-bit values reduced to
// their high byte rather than through libpng's linear-to-sRGB conversion. That is PIL's
// result for 16-bit RGB; PIL clips 16-bit grayscale to 255 instead (docs/images.md lists
// this and the other PNGs whose pixels differ from PIL's).

ImageInfo png_begin(std::span<const uint8_t> bytes, png_image& image) {
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    std::string message = image.message;
    png_image_free(&image);
    RN_FAIL() << "bad PNG: " << message;
  }
  ImageInfo info;
  info.codec = ImageCodec::png;
  info.width = static_cast<int>(image.width);
  info.height = static_cast<int>(image.height);
  info.channels = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(image.format));
  if (info.width <= 0 || info.height <= 0 || info.width > kMaxSide || info.height > kMaxSide ||
      int64_t{info.width} * info.height > kMaxPixels) {
    png_image_free(&image);
    check_size(info.codec, info.width, info.height);
  }
  return info;
}

void decode_png(std::span<const uint8_t> bytes, const DecodeRequest& request, DecodedImage& out,
                std::vector<uint8_t>& scratch) {
  png_image image;
  const ImageInfo info = png_begin(bytes, image);
  DecodeRequest r;
  try {
    r = full_region(request, info.width, info.height);
  } catch (...) {
    png_image_free(&image);
    throw;
  }
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const bool wide = (image.format & PNG_FORMAT_FLAG_LINEAR) != 0;
  image.format = (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB) | (wide ? PNG_FORMAT_FLAG_LINEAR : 0);
  const int channels = alpha ? 4 : 3;
  const size_t sample = wide ? 2 : 1;
  const size_t row_bytes = static_cast<size_t>(info.width) * channels * sample;
  scratch.resize(row_bytes * static_cast<size_t>(info.height));
  if (!png_image_finish_read(&image, nullptr, scratch.data(), 0, nullptr)) {
    std::string message = image.message;
    png_image_free(&image);
    RN_FAIL() << "bad PNG: " << message;
  }
  png_image_free(&image);
  // PNG has no cheap partial decode: the region is cut from the full image.
  out.width = r.width;
  out.height = r.height;
  out.pixels.resize(static_cast<size_t>(r.width) * static_cast<size_t>(r.height) * 3);
  for (int y = 0; y < r.height; ++y) {
    const uint8_t* src = scratch.data() + row_bytes * static_cast<size_t>(r.y + y);
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(r.width) * 3;
    for (int x = 0; x < r.width; ++x) {
      const size_t px = static_cast<size_t>(r.x + x) * channels;
      for (int c = 0; c < 3; ++c) {
        if (wide) {
          uint16_t v;
          std::memcpy(&v, src + (px + c) * 2, 2);  // native-endian 16-bit from libpng
          dst[x * 3 + c] = static_cast<uint8_t>(v >> 8);
        } else {
          dst[x * 3 + c] = src[px + c];
        }
      }
    }
  }
  out.region_x0 = 0;
  out.region_y0 = 0;
  out.region_x1 = static_cast<float>(r.width);
  out.region_y1 = static_cast<float>(r.height);
  out.scale_num = out.scale_denom = 1;
  out.full_width = info.width;
  out.full_height = info.height;
}

void decode_raw(const EncodedImage& image, const DecodeRequest& request, DecodedImage& out) {
  const int w = image.raw_width, h = image.raw_height;
  check_size(ImageCodec::raw, w, h);
  const size_t expected = static_cast<size_t>(w) * static_cast<size_t>(h) * 3;
  RN_CHECK(image.bytes.size() == expected)
      << "raw record of " << w << "x" << h << "x3 holds " << image.bytes.size() << " bytes, not " << expected;
  const DecodeRequest r = full_region(request, w, h);
  out.width = r.width;
  out.height = r.height;
  out.pixels.resize(static_cast<size_t>(r.width) * static_cast<size_t>(r.height) * 3);
  for (int y = 0; y < r.height; ++y) {
    std::memcpy(out.pixels.data() + static_cast<size_t>(y) * r.width * 3,
                image.bytes.data() + (static_cast<size_t>(r.y + y) * w + r.x) * 3, static_cast<size_t>(r.width) * 3);
  }
  out.region_x0 = out.region_y0 = 0;
  out.region_x1 = static_cast<float>(r.width);
  out.region_y1 = static_cast<float>(r.height);
  out.scale_num = out.scale_denom = 1;
  out.full_width = w;
  out.full_height = h;
}

ImageCodec codec_of(const EncodedImage& image) {
  if (image.codec != ImageCodec::unknown) return image.codec;
  RN_CHECK(!image.bytes.empty()) << "empty file (0 bytes)";
  const ImageCodec c = sniff_codec(image.bytes);
  RN_CHECK(c != ImageCodec::unknown) << "not a JPEG or PNG file (first bytes do not match either format)";
  return c;
}

}  // namespace

ImageInfo read_image_info(std::span<const uint8_t> bytes) {
  RN_CHECK(!bytes.empty()) << "empty file (0 bytes)";
  switch (sniff_codec(bytes)) {
    case ImageCodec::jpeg:
      return jpeg_info(bytes);
    case ImageCodec::png: {
      png_image image;
      const ImageInfo info = png_begin(bytes, image);
      png_image_free(&image);
      return info;
    }
    default:
      break;
  }
  RN_FAIL() << "not a JPEG or PNG file (first bytes do not match either format)";
}

ImageInfo image_info(const EncodedImage& image) {
  if (image.codec == ImageCodec::raw) {
    check_size(ImageCodec::raw, image.raw_width, image.raw_height);
    return ImageInfo{ImageCodec::raw, image.raw_width, image.raw_height, 3};
  }
  codec_of(image);
  return read_image_info(image.bytes);
}

void decode_image(const EncodedImage& image, const DecodeRequest& request, DecodedImage& out) {
  switch (codec_of(image)) {
    case ImageCodec::jpeg:
      return decode_jpeg(image.bytes, request, out);
    case ImageCodec::png: {
      thread_local std::vector<uint8_t> scratch;
      decode_png(image.bytes, request, out, scratch);
      if (scratch.capacity() > (64u << 20)) std::vector<uint8_t>().swap(scratch);  // do not pin a huge PNG's memory
      return;
    }
    case ImageCodec::raw:
      return decode_raw(image, request, out);
    case ImageCodec::unknown:
      break;
  }
  RN_FAIL() << "unknown image codec";
}

void encode_jpeg(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>& out) {
  RN_CHECK(width > 0 && height > 0) << "cannot encode a " << width << "x" << height << " image";
  RN_CHECK(quality >= 1 && quality <= 100) << "JPEG quality " << quality << " outside [1, 100]";
  tjhandle handle = tjInitCompress();
  RN_CHECK(handle != nullptr) << "tjInitCompress failed: " << tjGetErrorStr2(nullptr);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(handle, rgb, width, 0, height, TJPF_RGB, &buffer, &size, TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
  std::string message = rc != 0 ? tjGetErrorStr2(handle) : "";
  if (rc == 0) out.assign(buffer, buffer + size);
  tjFree(buffer);
  tjDestroy(handle);
  RN_CHECK(rc == 0) << "JPEG encoding failed: " << message;
}

std::vector<LibraryVersion> image_codec_versions() {
  // LIBJPEG_TURBO_VERSION_NUMBER is major * 1000000 + minor * 1000 + patch.
  constexpr int jv = LIBJPEG_TURBO_VERSION_NUMBER;
  return {{"libjpeg-turbo",
           std::to_string(jv / 1000000) + "." + std::to_string(jv / 1000 % 1000) + "." + std::to_string(jv % 1000)},
          {"libpng", png_get_libpng_ver(nullptr)}};
}

}  // namespace rn

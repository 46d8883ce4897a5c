// Image codecs: JPEG through libjpeg-turbo (DCT-domain downscaling and region-of-interest
// decoding, chosen from the crop that will be taken), PNG through libpng, and raw RGB
// pixels (packed shards). Every decoder writes 8-bit RGB in HWC order whatever the file
// holds: grayscale is replicated, CMYK/YCCK (Adobe-inverted or not) converted as PIL does,
// alpha dropped, 16-bit samples reduced. The codec comes from the bytes, never the file
// name (ImageNet has PNGs named .JPEG). A malformed, truncated or empty input is an
// rn::Error that says what is wrong; it never crashes or returns partial pixels.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/build_info.h"

namespace rn {

enum class ImageCodec : uint8_t { unknown, jpeg, png, raw };
std::string_view codec_name(ImageCodec codec);

// The codec the magic bytes announce (raw cannot be sniffed: its records say so).
ImageCodec sniff_codec(std::span<const uint8_t> bytes);

struct ImageInfo {
  ImageCodec codec = ImageCodec::unknown;
  int width = 0;
  int height = 0;
  int channels = 0;  // as stored: 1 (gray), 3 (RGB/YCbCr), 4 (CMYK/YCCK, RGBA); decoders output 3
};

// Reads only the header. Throws rn::Error on an unknown format or a malformed header.
ImageInfo read_image_info(std::span<const uint8_t> bytes);

// An encoded image as a dataset hands it to the decoder: the bytes (owned by `storage` or
// pointing into a memory-mapped shard) and, for raw pixels, the size the record declares.
struct EncodedImage {
  std::span<const uint8_t> bytes;
  std::vector<uint8_t> storage;            // reused between reads; `bytes` may point into it
  ImageCodec codec = ImageCodec::unknown;  // unknown: sniffed from the bytes
  int raw_width = 0;                       // codec raw: the record's size (3 channels, HWC)
  int raw_height = 0;

  // Points `bytes` at `storage` (after filling storage).
  void use_storage() { bytes = std::span<const uint8_t>(storage.data(), storage.size()); }
};

ImageInfo image_info(const EncodedImage& image);

// What part of the image to decode and how small it may come out.
struct DecodeRequest {
  // The region of interest in stored-pixel coordinates; width 0 means the whole image.
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  // The region will be resized to this size: a decoder may downscale (JPEG: by n/8 in the
  // DCT domain) as long as the decoded region stays at least this large. 0: full size.
  int min_width = 0;
  int min_height = 0;
};

// Decoded RGB pixels: a rectangle of the (possibly downscaled) image that contains the
// requested region, and where that region lies inside it, in decoded-pixel units (floats:
// downscaling by n/8 makes the edges fractional).
struct DecodedImage {
  std::vector<uint8_t> pixels;  // height * width * 3, reused between decodes
  int width = 0;
  int height = 0;
  float region_x0 = 0, region_y0 = 0, region_x1 = 0, region_y1 = 0;
  int scale_num = 1;  // the image was decoded at scale_num / scale_denom of its stored size
  int scale_denom = 1;
  int full_width = 0;  // the stored size
  int full_height = 0;
};

// Decodes `image` as requested. Throws rn::Error (what is wrong) on bad data.
void decode_image(const EncodedImage& image, const DecodeRequest& request, DecodedImage& out);

// JPEG-encodes 8-bit RGB HWC pixels at `quality` (1..100, 4:2:0) into `out`.
void encode_jpeg(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>& out);

// The decoders' versions (core/build_info.h): libjpeg-turbo as compiled against (it has no
// run-time query), libpng as loaded. Decoders differ in their YUV->RGB rounding, so a run's
// accuracy can depend on them.
std::vector<LibraryVersion> image_codec_versions();

}  // namespace rn

// Decoding and resizing against PIL, the reference torchvision-trained weights were trained
// with. tools/make_test_images.py writes the files and PIL's pixels into the build tree
// (skipped with a reason when /usr/bin/python3 has no PIL/numpy).
#include "data/image_codec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/image_folder.h"
#include "data/image_resize.h"

namespace rn {
namespace {

const std::string& images_dir() {
  static const std::string dir = std::string(RN_BINARY_DIR) + "/test_images";
  return dir;
}

// ctest runs every test in its own process, several at once: the images are made once, in
// a private folder renamed into place, so no test ever reads a half-written set.
bool make_images() {
  static const bool ok = [] {
    namespace fs = std::filesystem;
    if (fs::exists(images_dir() + "/manifest.json")) return true;
    const std::string tmp = images_dir() + ".tmp" + std::to_string(::getpid());
    const std::string cmd = "/usr/bin/python3 " RN_SOURCE_DIR "/tools/make_test_images.py " + tmp + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) return false;
    std::error_code ec;
    fs::rename(tmp, images_dir(), ec);  // fails harmlessly when another process was first
    fs::remove_all(tmp, ec);
    return fs::exists(images_dir() + "/manifest.json");
  }();
  return ok;
}

nlohmann::json manifest() {
  std::ifstream in(images_dir() + "/manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> file_bytes(const std::string& name) {
  std::vector<uint8_t> bytes;
  read_file_bytes(images_dir() + "/" + name, bytes);
  return bytes;
}

EncodedImage encoded(const std::string& name) {
  EncodedImage e;
  e.storage = file_bytes(name);
  e.use_storage();
  return e;
}

// Largest absolute difference between two equally sized pixel arrays.
int max_diff(const uint8_t* a, const uint8_t* b, size_t n) {
  int m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(int{a[i]} - int{b[i]}));
  return m;
}

#define REQUIRE_IMAGES() \
  if (!make_images()) GTEST_SKIP() << "/usr/bin/python3 with PIL and numpy is needed to make the reference images"

TEST(ImageCodec, DecodesEveryKindExactlyAsPil) {
  REQUIRE_IMAGES();
  int cases = 0;
  const nlohmann::json m = manifest();
  for (const auto& c : m["decode"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const EncodedImage e = encoded(c["file"]);
    const ImageInfo info = image_info(e);
    EXPECT_EQ(codec_name(info.codec), std::string(c["kind"]));
    EXPECT_EQ(info.width, c["width"].get<int>());
    EXPECT_EQ(info.height, c["height"].get<int>());
    DecodedImage d;
    decode_image(e, DecodeRequest{}, d);
    ASSERT_EQ(d.width, info.width);
    ASSERT_EQ(d.height, info.height);
    const std::vector<uint8_t> ref = file_bytes(name + ".rgb");
    ASSERT_EQ(ref.size(), d.pixels.size());
    // The same libjpeg-turbo with the same settings (ISLOW DCT, fancy upsampling) as PIL:
    // identical pixels, CMYK conversion included.
    EXPECT_EQ(max_diff(ref.data(), d.pixels.data(), ref.size()), 0);
    ++cases;
  }
  EXPECT_GE(cases, 9);
}

TEST(ImageCodec, ReportsChannelsAsStored) {
  REQUIRE_IMAGES();
  EXPECT_EQ(read_image_info(file_bytes("gray.jpg")).channels, 1);
  EXPECT_EQ(read_image_info(file_bytes("cmyk.jpg")).channels, 4);
  EXPECT_EQ(read_image_info(file_bytes("baseline.jpg")).channels, 3);
  EXPECT_EQ(read_image_info(file_bytes("rgba.png")).channels, 4);
}

TEST(ImageCodec, RegionOfInterestMatchesFullDecode) {
  REQUIRE_IMAGES();
  for (const char* file : {"baseline.jpg", "progressive.jpg", "cmyk.jpg", "gray.jpg", "png_as_jpeg.JPEG"}) {
    SCOPED_TRACE(file);
    const EncodedImage e = encoded(file);
    DecodedImage full;
    decode_image(e, DecodeRequest{}, full);
    for (const DecodeRequest& r : {DecodeRequest{37, 21, 90, 77}, DecodeRequest{32, 16, 64, 48}}) {
      DecodedImage roi;
      decode_image(e, r, roi);
      ASSERT_EQ(roi.scale_num, roi.scale_denom);  // no min size given: full resolution
      // The decoded rectangle contains the region; its pixels are those of the full decode.
      ASSERT_GE(roi.region_x0, 0.0f);
      ASSERT_GE(roi.region_y0, 0.0f);
      ASSERT_LE(roi.region_x1, static_cast<float>(roi.width));
      ASSERT_LE(roi.region_y1, static_cast<float>(roi.height));
      EXPECT_FLOAT_EQ(roi.region_x1 - roi.region_x0, static_cast<float>(r.width));
      EXPECT_FLOAT_EQ(roi.region_y1 - roi.region_y0, static_cast<float>(r.height));
      // Offset of the decoded rectangle in the full image; compare the region's pixels.
      const int ox = r.x - static_cast<int>(roi.region_x0), oy = r.y - static_cast<int>(roi.region_y0);
      int worst = 0;
      for (int y = static_cast<int>(roi.region_y0); y < static_cast<int>(roi.region_y1); ++y) {
        const int x0 = static_cast<int>(roi.region_x0);
        worst = std::max(worst, max_diff(roi.pixels.data() + (static_cast<size_t>(y) * roi.width + x0) * 3,
                                         full.pixels.data() + (static_cast<size_t>(oy + y) * full.width + ox + x0) * 3,
                                         static_cast<size_t>(r.width) * 3));
      }
      EXPECT_EQ(worst, 0) << "region at " << r.x << "," << r.y;
    }
  }
}

TEST(ImageCodec, DownscalesInTheDctDomainOnlyAsFarAsTheTargetAllows) {
  REQUIRE_IMAGES();
  const EncodedImage e = encoded("baseline.jpg");  // 203 x 141
  struct Case {
    int min_w, min_h, expect_num;
  };
  for (const Case& c : {Case{20, 10, 1}, Case{30, 20, 2}, Case{50, 30, 2}, Case{51, 30, 4}, Case{101, 60, 4}, Case{102, 60, 8}, Case{203, 141, 8}}) {
    DecodeRequest r;
    r.min_width = c.min_w;
    r.min_height = c.min_h;
    DecodedImage d;
    decode_image(e, r, d);
    SCOPED_TRACE(std::to_string(c.min_w) + "x" + std::to_string(c.min_h));
    EXPECT_EQ(d.scale_num, c.expect_num);
    EXPECT_EQ(d.scale_denom, 8);
    EXPECT_GE(d.region_x1 - d.region_x0, static_cast<float>(c.min_w));
    EXPECT_GE(d.region_y1 - d.region_y0, static_cast<float>(c.min_h));
    EXPECT_EQ(d.width, (203 * c.expect_num + 7) / 8);
  }
}

TEST(ImageCodec, BadInputIsAnErrorThatSaysWhat) {
  REQUIRE_IMAGES();
  DecodedImage d;
  auto decode = [&](std::vector<uint8_t> bytes) {
    EncodedImage e;
    e.storage = std::move(bytes);
    e.use_storage();
    decode_image(e, DecodeRequest{}, d);
  };
  auto message = [&](std::vector<uint8_t> bytes) -> std::string {
    try {
      decode(std::move(bytes));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({}).find("empty file"), std::string::npos);
  EXPECT_NE(message({'G', 'I', 'F', '8', '9', 'a', 0, 0}).find("not a JPEG or PNG"), std::string::npos);
  for (const char* file : {"baseline.jpg", "progressive.jpg", "png_as_jpeg.JPEG"}) {
    SCOPED_TRACE(file);
    std::vector<uint8_t> bytes = file_bytes(file);
    bytes.resize(bytes.size() / 2);
    const std::string m = message(bytes);
    EXPECT_FALSE(m.empty()) << "a truncated file decoded without error";
    EXPECT_TRUE(m.find("bad JPEG") != std::string::npos || m.find("bad PNG") != std::string::npos) << m;
    bytes.resize(12);  // header only
    EXPECT_FALSE(message(bytes).empty());
  }
  // A damaged header field: a zero image height.
  std::vector<uint8_t> bytes = file_bytes("baseline.jpg");
  for (size_t i = 0; i + 8 < bytes.size(); ++i) {
    if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {  // SOF0: length(2) precision(1) height(2) width(2)
      bytes[i + 5] = 0;
      bytes[i + 6] = 0;
      break;
    }
  }
  EXPECT_NE(message(bytes).find("bad JPEG"), std::string::npos);
}

TEST(ImageCodec, RegionOutsideTheImageIsRefused) {
  REQUIRE_IMAGES();
  const EncodedImage e = encoded("baseline.jpg");
  DecodeRequest r;
  r.x = 150;
  r.width = 100;
  r.height = 10;
  DecodedImage d;
  EXPECT_THROW(decode_image(e, r, d), Error);
}

TEST(ImageCodec, EncodeRoundTrips) {
  std::vector<uint8_t> rgb(64 * 48 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i / 3 % 64) * 3 + (i % 3) * 20);
  std::vector<uint8_t> jpeg;
  encode_jpeg(rgb.data(), 64, 48, 95, jpeg);
  EncodedImage e;
  e.storage = jpeg;
  e.use_storage();
  const ImageInfo info = image_info(e);
  EXPECT_EQ(info.codec, ImageCodec::jpeg);
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 48);
  DecodedImage d;
  decode_image(e, DecodeRequest{}, d);
  EXPECT_LE(max_diff(rgb.data(), d.pixels.data(), rgb.size()), 12);
  EXPECT_THROW(encode_jpeg(rgb.data(), 64, 48, 0, jpeg), Error);
}

// The baseline JPEG at full size: the source of the resize references.
DecodedImage baseline_pixels() {
  DecodedImage full;
  decode_image(encoded("baseline.jpg"), DecodeRequest{}, full);
  return full;
}

TEST(ImageResize, CropThenResizeMatchesPil) {
  REQUIRE_IMAGES();
  const DecodedImage full = baseline_pixels();
  const ImageView src{full.pixels.data(), full.width, full.height, 3, 0};
  ResizeScratch scratch;
  const nlohmann::json m = manifest();
  int cases = 0;
  for (const auto& c : m["resize"]) {
    ++cases;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int x = c["x"], y = c["y"], w = c["w"], h = c["h"], ow = c["out_w"], oh = c["out_h"];
    std::vector<uint8_t> out(static_cast<size_t>(ow) * oh * 3);
    resize_bilinear_aa(src, ResizeBox{float(x), float(y), float(x + w), float(y + h)}, out.data(), ow, oh, 0, false,
                       scratch);
    const std::vector<uint8_t> ref = file_bytes(name + ".rgb");
    ASSERT_EQ(ref.size(), out.size());
    EXPECT_EQ(max_diff(ref.data(), out.data(), ref.size()), 0);

    // Flipped output is the mirror image.
    std::vector<uint8_t> flipped(out.size());
    resize_bilinear_aa(src, ResizeBox{float(x), float(y), float(x + w), float(y + h)}, flipped.data(), ow, oh, 0, true,
                       scratch);
    int worst = 0;
    for (int yy = 0; yy < oh; ++yy)
      for (int xx = 0; xx < ow; ++xx)
        worst = std::max(worst, max_diff(&out[(static_cast<size_t>(yy) * ow + xx) * 3],
                                         &flipped[(static_cast<size_t>(yy) * ow + (ow - 1 - xx)) * 3], 3));
    EXPECT_EQ(worst, 0);
  }
  EXPECT_EQ(cases, 5);
}

TEST(ImageResize, ResizeThenCentreCropMatchesTorchvisionEval) {
  REQUIRE_IMAGES();
  const DecodedImage full = baseline_pixels();
  const ImageView src{full.pixels.data(), full.width, full.height, 3, 0};
  ResizeScratch scratch;
  const nlohmann::json m = manifest();
  int cases = 0;
  for (const auto& c : m["eval"]) {
    ++cases;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    ResizeWindow win;
    win.full_width = c["resized_w"];
    win.full_height = c["resized_h"];
    win.x = c["left"];
    win.y = c["top"];
    win.width = win.height = c["crop"];
    std::vector<uint8_t> out(static_cast<size_t>(win.width) * win.height * 3);
    resize_bilinear_aa(src, ResizeBox{0, 0, float(full.width), float(full.height)}, win, out.data(), 0, false, scratch);
    const std::vector<uint8_t> ref = file_bytes(name + ".rgb");
    ASSERT_EQ(ref.size(), out.size());
    EXPECT_EQ(max_diff(ref.data(), out.data(), ref.size()), 0);
  }
  EXPECT_EQ(cases, 3);
}

TEST(ImageResize, StridedDestinationAndOneChannel) {
  // A 1-channel ramp shrunk by 2 averages neighbour pairs.
  std::vector<uint8_t> src(8 * 2);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 8; ++x) src[static_cast<size_t>(y) * 8 + x] = static_cast<uint8_t>(x * 10);
  std::vector<uint8_t> dst(2 * 16, 0xEE);
  ResizeScratch scratch;
  resize_bilinear_aa(ImageView{src.data(), 8, 2, 1, 0}, ResizeBox{0, 0, 8, 2}, dst.data(), 4, 2, 16, false, scratch);
  // Shrinking by 2 widens the triangle to support 2: output 0 (centre 1.0) weighs pixels
  // 0, 1, 2 by 0.75, 0.75, 0.25 (renormalised by 1.75): 12.5 / 1.75 = 7.1 -> 7; output 1
  // (centre 3.0) weighs pixels 1..4 by 0.25, 0.75, 0.75, 0.25: 50 / 2 = 25.
  EXPECT_EQ(dst[0], 7);
  EXPECT_EQ(dst[1], 25);
  EXPECT_EQ(dst[4], 0xEE);  // the stride gap is untouched
  EXPECT_EQ(dst[16], dst[0]);
}

}  // namespace
}  // namespace rn

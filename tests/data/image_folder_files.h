// Writes a small ImageFolder tree of synthetic JPEGs (root/<class>/<name>.jpg) for the
// shard and `resnet pack` tests, so that no image files need to be checked in.
#pragma once

#include <png.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image_codec.h"

namespace rn::test {

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Smooth RGB pixels that depend on (seed, x, y), so every image differs.
inline std::vector<uint8_t> synthetic_rgb(int width, int height, int seed) {
  std::vector<uint8_t> px(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>((x * (c + 1) * 3 + y * 2 + seed * 37) & 0xff);
  return px;
}

inline std::vector<uint8_t> synthetic_jpeg(int width, int height, int seed, int quality = 92) {
  std::vector<uint8_t> out;
  const auto px = synthetic_rgb(width, height, seed);
  encode_jpeg(px.data(), width, height, quality, out);
  return out;
}

// A PNG of synthetic_rgb pixels, through libpng's simplified API.
inline std::vector<uint8_t> synthetic_png(int width, int height, int seed) {
  const auto px = synthetic_rgb(width, height, seed);
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, px.data(), 0, nullptr);
  std::vector<uint8_t> out(size);
  if (size == 0 || !png_image_write_to_memory(&image, out.data(), &size, 0, px.data(), 0, nullptr)) out.clear();
  out.resize(size);
  return out;
}

// `classes` class folders ("class_0", ...) of `per_class` JPEGs of varying size, from
// (24 + 6k) x (18 + 5k) pixels; returns their paths in ImageFolder order.
inline std::vector<std::filesystem::path> write_image_folder(const std::filesystem::path& root, int classes,
                                                             int per_class) {
  std::vector<std::filesystem::path> paths;
  for (int c = 0; c < classes; ++c)
    for (int k = 0; k < per_class; ++k) {
      const auto path = root / ("class_" + std::to_string(c)) / ("img_" + std::to_string(k) + ".jpg");
      write_bytes(path, synthetic_jpeg(24 + 6 * k, 18 + 5 * k, c * 100 + k));
      paths.push_back(path);
    }
  return paths;
}

inline std::vector<uint8_t> file_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace rn::test

// Writes small IDX files (gzip or plain) into a per-test temporary folder, including
// deliberately broken ones, for the IDX reader tests.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/check.h"

namespace rn::test {

inline void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// The bytes of an IDX u8 file: magic, dims, then `data`.
inline std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  gzFile f = gzopen(path.c_str(), gzip ? "wb6" : "wbT");  // "T": plain, no gzip header
  RN_CHECK(f != nullptr) << "cannot write " << path;
  if (!bytes.empty()) {
    RN_CHECK(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()))
        << "short write to " << path;
  }
  RN_CHECK(gzclose(f) == Z_OK) << "closing " << path;
}

// A fresh, empty temporary folder named after the running test, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = std::filesystem::temp_directory_path() / ("rn_test_data_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace rn::test

// The pieces of the packed-shard format (docs/shards.md) other than the index: POSIX ustar
// tar headers (the shards are WebDataset-style tars that tar, Python's tarfile and
// webdataset read), numpy .npy v1.0 headers for raw-pixel records, the file names, and the
// dataset.json manifest at the top of a packed folder.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rn {

inline constexpr std::string_view kShardFormatName = "rn-shards";
inline constexpr int kShardFormatVersion = 1;
inline constexpr std::string_view kShardManifestName = "dataset.json";
// Written at the start of a pack and removed with its dataset.json in place: shard files
// beside it are an unfinished pack's, which a rerun may finish.
inline constexpr const char* kPackMarker = ".resnet-pack";
inline constexpr uint64_t kTarBlock = 512;

std::string shard_tar_name(int64_t shard);    // "shard-00003.tar"
std::string shard_index_name(int64_t shard);  // "shard-00003.idx"

// Bytes a member of `size` bytes occupies after its header: rounded up to whole blocks.
inline uint64_t tar_padded_size(uint64_t size) { return (size + kTarBlock - 1) / kTarBlock * kTarBlock; }

// The 512-byte ustar header of a regular file `name` (at most 100 bytes) of `size` bytes:
// mode 0644, owner 0/0, mtime 0, so that packing the same input twice gives the same bytes.
std::array<uint8_t, kTarBlock> make_tar_header(std::string_view name, uint64_t size);

// The .npy v1.0 header of a C-order uint8 array of shape (height, width, 3), padded with
// spaces so that the pixels start at a multiple of 64 bytes.
std::string make_npy_header(int height, int width);

// Checks that `bytes` is a .npy (v1.0 or v2.0) holding a C-order uint8 (height, width, 3)
// array with exactly height * width * 3 bytes of data, and returns the offset of the data.
// Throws rn::Error saying what is wrong.
size_t parse_npy_header(std::span<const uint8_t> bytes, int height, int width);

// dataset.json: what a reader needs before opening any shard.
struct ShardManifestEntry {
  std::string tar;
  std::string index;
  int64_t records = 0;
  uint64_t tar_bytes = 0;
};

struct ShardManifest {
  int version = kShardFormatVersion;
  std::vector<std::string> classes;
  std::vector<ShardManifestEntry> shards;
  int64_t records = 0;  // over all shards
  // How it was packed (informational for readers; a rerun of `resnet pack` compares the
  // options recorded in each index).
  std::string source;
  int max_size = 0;
  int quality = 0;
  bool raw = false;
  int64_t records_per_shard = 0;
  int64_t skipped = 0;
  // Packed from a list file ("relative/path label"): the classes are the label numbers, and a
  // reader matches them to a model's classes by position, as it does the list's labels.
  bool labels_are_positions = false;
};

// Parses dataset.json's text; errors name `file` (and the JSON line and column).
ShardManifest parse_shard_manifest(std::string_view text, const std::string& file);
std::string format_shard_manifest(const ShardManifest& manifest);

}  // namespace rn

// A folder packed by `resnet pack` (docs/shards.md): dataset.json, then per shard a tar and
// its index. Everything is validated when the dataset is opened, so a bad folder fails at
// start with an error naming the file (and line) instead of in the middle of an epoch.
// The tars are memory-mapped read-only; read() points EncodedImage::bytes into the
// mapping, without a copy, after checking the record's CRC32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/encoded_dataset.h"
#include "data/shard_format.h"

namespace rn {

struct ShardDatasetOptions {
  // Check every record's CRC32 when it is read (zlib's crc32: about 2.5 GB/s per core here, 0.04 ms for a 110 KB JPEG).
  bool verify_checksums = true;
};

class ShardDataset : public EncodedDataset {
 public:
  // `dir` holds dataset.json. Throws rn::Error naming the file and what is wrong.
  explicit ShardDataset(const std::string& dir, ShardDatasetOptions options = {});
  ~ShardDataset() override;
  ShardDataset(const ShardDataset&) = delete;
  ShardDataset& operator=(const ShardDataset&) = delete;

  int64_t size() const override { return static_cast<int64_t>(records_.size()); }
  const std::vector<std::string>& classes() const override { return manifest_.classes; }
  bool labels_are_positions() const override { return manifest_.labels_are_positions; }
  int read(int64_t index, EncodedImage& out) const override;
  std::string source(int64_t index) const override;
  std::string name() const override { return "shards:" + dir_; }

  const ShardManifest& manifest() const { return manifest_; }
  std::string_view key(int64_t index) const { return key_of(records_[static_cast<size_t>(index)]); }
  int label(int64_t index) const { return records_[static_cast<size_t>(index)].label; }
  // The stored size (for raw records, the pixel size), from the index.
  int stored_width(int64_t index) const { return records_[static_cast<size_t>(index)].width; }
  int stored_height(int64_t index) const { return records_[static_cast<size_t>(index)].height; }
  // What the index says of a record's content (its CRC-32, size and label), hashed: a pack of
  // this pack knows from it, without reading, whether a record changed.
  uint64_t content_hash(int64_t index) const {
    const Record& r = records_[static_cast<size_t>(index)];
    return (static_cast<uint64_t>(r.crc32) << 32) ^ (r.size * 0x9e3779b97f4a7c15ull) ^
           (static_cast<uint64_t>(static_cast<uint32_t>(r.label)) * 0xc2b2ae3d27d4eb4full);
  }

 private:
  struct Mapping;
  // 48 bytes; the keys live in one string (ImageNet: 1.28 million records).
  struct Record {
    uint64_t key_offset;  // into keys_
    uint64_t offset;
    uint64_t size;
    uint32_t crc32;
    uint32_t shard;
    int label;
    int width;
    int height;
    ImageCodec codec;
    uint8_t key_size;
  };

  void open_shard(size_t shard);
  std::string_view key_of(const Record& r) const { return std::string_view(keys_).substr(r.key_offset, r.key_size); }

  std::string dir_;
  ShardDatasetOptions options_;
  ShardManifest manifest_;
  std::vector<std::unique_ptr<Mapping>> maps_;
  std::vector<Record> records_;
  std::string keys_;
};

}  // namespace rn

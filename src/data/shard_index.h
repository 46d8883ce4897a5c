// The index beside each packed shard (shard-00000.idx): plain text, a few "#" header lines
// then one line per record, so that a reader finds any record of the tar without scanning
// it. The format is specified in docs/shards.md. The parser takes the text, not a file, so
// that it can be fuzzed (fuzz/shard_index_fuzz.cpp); every problem is an rn::Error naming
// the file, the line and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/image_codec.h"

namespace rn {

inline constexpr std::string_view kShardIndexMagic = "#rn-shard-index 1";

struct ShardIndexRecord {
  std::string key;      // the WebDataset key: members are <key>.jpg|.png|.npy and <key>.cls
  uint64_t offset = 0;  // of the image member's data inside the tar
  uint64_t size = 0;    // bytes of the image member (for .npy: header and pixels)
  uint32_t crc32 = 0;   // zlib crc32 of those bytes
  int label = 0;
  int width = 0;
  int height = 0;
  ImageCodec codec = ImageCodec::unknown;  // jpeg, png or raw (.npy)
};

struct ShardIndex {
  std::string tar;         // the tar's file name, in the same folder
  uint64_t tar_bytes = 0;  // its exact size: a shorter or longer tar is not the one indexed
  std::string options;     // the pack options that produced it ("max_size=0 quality=90 raw=0 ...")
  int64_t first = 0;       // the source records assigned to this shard: [first, first + count)
  int64_t count = 0;
  int64_t skipped = 0;  // of those, unreadable sources left out (count = records + skipped)
  // The source files' sizes and modification times, hashed (16 hex digits): a rerun repacks a
  // shard whose files changed though their names did not. Empty in indexes without the line.
  std::string sources;
  std::vector<ShardIndexRecord> records;
};

// Parses the text of an index. `file` names it in errors ("shard-00003.idx:17: ...").
ShardIndex parse_shard_index(std::string_view text, const std::string& file);
// The text parse_shard_index reads back.
std::string format_shard_index(const ShardIndex& index);

// The member-name extension of a codec: "jpg", "png", "npy".
std::string_view shard_member_extension(ImageCodec codec);
// A key is 1..80 characters of [A-Za-z0-9_-/], not starting or ending with '/' and without
// "//": no dots (WebDataset splits the member name at the first dot) and no whitespace.
inline constexpr size_t kMaxShardKeySize = 80;
bool is_valid_shard_key(std::string_view key);

}  // namespace rn

// libFuzzer target for the shard index parser (src/data/shard_index.cpp): any input must
// parse or be rejected with rn::Error, never crash, hang or read out of bounds. Needs only
// rn_core, zlib and the shard sources. A parsed index must survive a format/parse round
// trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/check.h"
#include "data/shard_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rn::ShardIndex index;
  try {
    index = rn::parse_shard_index(text, "fuzz.idx");
  } catch (const rn::Error&) {
    return 0;
  }
  const std::string again = rn::format_shard_index(index);
  const rn::ShardIndex reparsed = rn::parse_shard_index(again, "fuzz-roundtrip.idx");
  if (reparsed.records.size() != index.records.size() || rn::format_shard_index(reparsed) != again) std::abort();
  return 0;
}

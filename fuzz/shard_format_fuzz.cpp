// libFuzzer target for the shard format's readers (src/data/shard_format.cpp): the manifest
// (dataset.json) and the .npy header of a raw record. Any input must parse or be refused with
// rn::Error, never crash, overflow or read out of bounds. A parsed manifest must survive a
// format/parse round trip unchanged.
//
// The first byte chooses: even, the rest is a manifest; odd, the next two bytes are the
// record's expected height and width and the rest is the .npy record.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "core/check.h"
#include "data/shard_format.h"

namespace {

void manifest(std::string_view text) {
  rn::ShardManifest m;
  try {
    m = rn::parse_shard_manifest(text, "fuzz.json");
  } catch (const rn::Error&) {
    return;
  }
  const std::string again = rn::format_shard_manifest(m);
  const rn::ShardManifest reparsed = rn::parse_shard_manifest(again, "fuzz-roundtrip.json");
  if (reparsed.shards.size() != m.shards.size() || rn::format_shard_manifest(reparsed) != again) std::abort();
}

void npy(std::span<const uint8_t> bytes) {
  if (bytes.size() < 2) return;
  const int height = bytes[0], width = bytes[1];
  bytes = bytes.subspan(2);
  try {
    const size_t at = rn::parse_npy_header(bytes, height, width);
    if (at > bytes.size() || bytes.size() - at != static_cast<size_t>(height) * width * 3) std::abort();
  } catch (const rn::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0)
    manifest(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  else
    npy(std::span<const uint8_t>(data + 1, size - 1));
  return 0;
}

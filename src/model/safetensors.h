// Weights I/O in the safetensors format (https://github.com/huggingface/safetensors):
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
//
// The header maps each tensor name to {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}
// (byte offsets relative to the start of the data section) and may hold "__metadata__", a
// string-to-string object. Tensor names are torchvision's (see docs/weights.md).
//
// The reader validates the whole file before exposing anything: every malformed header, every
// out-of-range, overlapping or mis-sized entry, and every data byte not covered by a tensor is an
// rn::Error naming the file, the tensor and the problem. Holes and trailing bytes are errors, not
// warnings: the format forbids them, and a file with them was not written by a correct writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace rn {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_tag;       // as written in the file: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;  // empty for known tags with no rn::DType (I64, F64, BOOL, ...)
  size_t element_size = 0;     // bytes per element of dtype_tag
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, begin <= end
  uint64_t end = 0;

  uint64_t bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Reads and validates `path`; throws rn::Error naming the file (and tensor) on any problem.
  static SafetensorsFile load(const std::string& path);

  const std::string& path() const { return path_; }
  // All tensors, ordered by their data offset (the order of the bytes in the file).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A host view of tensor `name` (layout nchw, dense row-major), suitably aligned for its dtype.
  // Throws naming the tensor if it is missing or its dtype has no rn::DType (I64, F64, BOOL, ...).
  // The view is valid while this object (or the object it is moved into) lives.
  Tensor view(const std::string& name) const;
  // The raw little-endian bytes of any tensor, including those view() refuses (I64 counters).
  std::span<const std::byte> raw(const std::string& name) const;

 private:
  const SafetensorsEntry& require(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
  HostBuffer data_;                        // the data section, 64-byte aligned
  std::vector<HostBuffer> realigned_;      // private copies of entries whose offset breaks alignment
  std::vector<const std::byte*> address_;  // per entry: where its bytes live
};

// Writes `tensors` (host, dense; 4-D ones in nchw layout) and `metadata` to `path` atomically:
// a temporary file in the same directory is written, flushed and fsynced, renamed over `path`,
// and the directory is fsynced. On failure the temporary is removed, an existing `path` is left
// untouched, and an rn::Error names the path and the errno text. Names must be non-empty, unique
// and not "__metadata__". The header is padded with spaces to a multiple of 8 bytes; tensors are
// laid out without gaps, larger element sizes first (stable otherwise), so every tensor's offset
// is a multiple of its element size.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The metadata key write_safetensors() adds: the CRC-32 of the data section, as 8 hex digits.
// load() checks it where present (files from elsewhere have none).
inline constexpr std::string_view kDataCrc32Key = "rn.data_crc32";
// And the CRC-32 of the header text as written (its padding included), computed with this
// field's own 8 digits as "00000000": a flipped bit in a metadata value (a checkpoint's step, its
// loss scale) or in a tensor's entry is damage found, not a value believed.
inline constexpr std::string_view kHeaderCrc32Key = "rn.header_crc32";
// For tests and tools that edit a header on purpose: sets the header CRC field of a whole file
// held in `bytes` to match its header as it now is. False if it has no such field.
bool reseal_header_crc(std::string& bytes);

// The safetensors dtype tag for `t` ("F32", "BF16", "F16", "I32", "U8").
std::string_view safetensors_dtype_tag(DType t);

}  // namespace rn

#include "data/shard_index.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <unordered_set>

#include "core/check.h"

namespace rn {
namespace {

constexpr int kMaxImageSide = 1 << 20;

// Hands out the lines of the text one by one, counting them for messages.
class LineReader {
 public:
  LineReader(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    const size_t end = text_.find('\n', pos_);
    RN_CHECK(end != std::string_view::npos) << where_next() << "the last line has no newline: a truncated index";
    line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++line_;
    return true;
  }
  // "file:line: " of the line just read.
  std::string where() const { return fmt::format("{}:{}: ", file_, line_); }
  std::string where_next() const { return fmt::format("{}:{}: ", file_, line_ + 1); }

 private:
  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
  int64_t line_ = 0;
};

// Splits on single spaces; an empty field (two spaces, a leading or trailing space) is kept
// as empty so that the field count check reports it.
std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t space = line.find(' ', start);
    fields.push_back(line.substr(start, space == std::string_view::npos ? std::string_view::npos : space - start));
    if (space == std::string_view::npos) return fields;
    start = space + 1;
  }
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  if (s.size() > 60) out += "...";
  return out;
}

template <typename T>
T parse_number(std::string_view field, const char* what, const LineReader& lines, T max, int base = 10) {
  T value{};
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, value, base);
  RN_CHECK(!field.empty() && ec == std::errc() && ptr == end && !(value < T{}) && value <= max)
      << lines.where() << "bad " << what << " '" << printable(field) << "': expected "
      << (base == 16 ? "8 hex digits" : "a decimal number") << (base == 10 ? fmt::format(" <= {}", max) : "");
  return value;
}

// The codecs a record may hold: its name in the index and its member's extension.
struct CodecNames {
  ImageCodec codec;
  std::string_view index_name;
  std::string_view extension;
};
constexpr CodecNames kCodecs[] = {
    {ImageCodec::jpeg, "jpeg", "jpg"}, {ImageCodec::png, "png", "png"}, {ImageCodec::raw, "raw", "npy"}};

const CodecNames& codec_names(ImageCodec codec) {
  for (const auto& c : kCodecs)
    if (c.codec == codec) return c;
  RN_FAIL() << "a shard record cannot hold codec " << static_cast<int>(codec);
}

ImageCodec parse_codec(std::string_view name, const LineReader& lines) {
  for (const auto& c : kCodecs)
    if (c.index_name == name) return c.codec;
  RN_FAIL() << lines.where() << "unknown codec '" << printable(name) << "': expected jpeg, png or raw";
}

// "#<name> <rest>": returns rest.
std::string_view header_field(std::string_view line, std::string_view name, const LineReader& lines) {
  std::string prefix(1, '#');
  prefix.append(name).push_back(' ');
  RN_CHECK(line.substr(0, prefix.size()) == prefix)
      << lines.where() << "expected the header line '" << prefix << "...', got '" << printable(line) << "'";
  return line.substr(prefix.size());
}

void parse_header(LineReader& lines, ShardIndex& index) {
  std::string_view line;
  RN_CHECK(lines.next(line)) << lines.where_next() << "empty index: expected '" << kShardIndexMagic << "'";
  RN_CHECK(line == kShardIndexMagic) << lines.where() << "not a shard index (or a newer version): expected '"
                                     << kShardIndexMagic << "', got '" << printable(line) << "'";

  RN_CHECK(lines.next(line)) << lines.where_next() << "missing the '#tar NAME BYTES' line";
  auto tar = split_fields(header_field(line, "tar", lines));
  RN_CHECK(tar.size() == 2 && !tar[0].empty() && tar[0].find('/') == std::string_view::npos)
      << lines.where() << "expected '#tar NAME BYTES' with a file name without '/'";
  index.tar = std::string(tar[0]);
  index.tar_bytes = parse_number<uint64_t>(tar[1], "tar size", lines, std::numeric_limits<int64_t>::max());

  RN_CHECK(lines.next(line)) << lines.where_next() << "missing the '#range FIRST COUNT SKIPPED' line";
  auto range = split_fields(header_field(line, "range", lines));
  RN_CHECK(range.size() == 3) << lines.where() << "expected '#range FIRST COUNT SKIPPED'";
  constexpr int64_t kMaxCount = int64_t{1} << 40;
  index.first = parse_number<int64_t>(range[0], "first record", lines, kMaxCount);
  index.count = parse_number<int64_t>(range[1], "record count", lines, kMaxCount);
  index.skipped = parse_number<int64_t>(range[2], "skipped count", lines, index.count);

  RN_CHECK(lines.next(line)) << lines.where_next() << "missing the '#options ...' line";
  RN_CHECK(line == "#options" || line.substr(0, 9) == "#options ")
      << lines.where() << "expected the header line '#options ...', got '" << printable(line) << "'";
  index.options = std::string(line.size() > 9 ? line.substr(9) : std::string_view());
}

ShardIndexRecord parse_record(std::string_view line, const LineReader& lines, const ShardIndex& index) {
  const auto f = split_fields(line);
  RN_CHECK(f.size() == 8) << lines.where() << "expected 8 fields (key offset size crc32 label width height codec), got "
                          << f.size() << ": '" << printable(line) << "'";
  ShardIndexRecord r;
  RN_CHECK(is_valid_shard_key(f[0])) << lines.where() << "bad key '" << printable(f[0])
                                     << "': 1-80 characters of A-Z a-z 0-9 _ - /";
  r.key = std::string(f[0]);
  r.offset = parse_number<uint64_t>(f[1], "offset", lines, index.tar_bytes);
  r.size = parse_number<uint64_t>(f[2], "size", lines, index.tar_bytes);
  RN_CHECK(f[3].size() == 8) << lines.where() << "bad crc32 '" << printable(f[3]) << "': expected 8 hex digits";
  r.crc32 = parse_number<uint32_t>(f[3], "crc32", lines, std::numeric_limits<uint32_t>::max(), 16);
  r.label = parse_number<int>(f[4], "label", lines, std::numeric_limits<int>::max());
  r.width = parse_number<int>(f[5], "width", lines, kMaxImageSide);
  r.height = parse_number<int>(f[6], "height", lines, kMaxImageSide);
  r.codec = parse_codec(f[7], lines);
  RN_CHECK(r.offset % 512 == 0) << lines.where() << "offset " << r.offset
                                << " is not a multiple of 512: tar member data always starts on a block";
  RN_CHECK(r.offset + r.size <= index.tar_bytes)
      << lines.where() << "record '" << r.key << "' ends at byte " << r.offset + r.size << ", beyond the tar's "
      << index.tar_bytes << " bytes";
  RN_CHECK(r.width > 0 && r.height > 0) << lines.where() << "record '" << r.key << "' has an empty size " << r.width
                                        << "x" << r.height;
  if (r.codec == ImageCodec::raw) {
    RN_CHECK(r.size >= uint64_t(r.width) * uint64_t(r.height) * 3)
        << lines.where() << "raw record '" << r.key << "' of " << r.width << "x" << r.height << " needs at least "
        << uint64_t(r.width) * uint64_t(r.height) * 3 << " bytes, the index gives " << r.size;
  }
  return r;
}

}  // namespace

bool is_valid_shard_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxShardKeySize || key.front() == '/' || key.back() == '/') return false;
  char prev = 0;
  for (char c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '/';
    if (!ok || (c == '/' && prev == '/')) return false;
    prev = c;
  }
  return true;
}

std::string_view shard_member_extension(ImageCodec codec) { return codec_names(codec).extension; }

ShardIndex parse_shard_index(std::string_view text, const std::string& file) {
  LineReader lines(text, file);
  ShardIndex index;
  parse_header(lines, index);
  std::unordered_set<std::string_view> keys;
  std::string_view line;
  while (lines.next(line)) {
    if (line.starts_with("#sources ")) {
      index.sources = std::string(line.substr(9));
      continue;
    }
    if (!line.empty() && line.front() == '#') continue;  // a header line this version does not know
    index.records.push_back(parse_record(line, lines, index));
    RN_CHECK(keys.insert(line.substr(0, index.records.back().key.size())).second)
        << lines.where() << "duplicate key '" << index.records.back().key << "'";
  }
  const auto records = static_cast<int64_t>(index.records.size());
  RN_CHECK(records == index.count - index.skipped)
      << file << ": holds " << records << " records but its #range line says " << index.count << " assigned and "
      << index.skipped << " skipped (expected " << index.count - index.skipped << "): a truncated index";
  return index;
}

std::string format_shard_index(const ShardIndex& index) {
  std::string out;
  out.reserve(64 * (index.records.size() + 4));
  out += kShardIndexMagic;
  out += fmt::format("\n#tar {} {}\n#range {} {} {}\n#options {}\n", index.tar, index.tar_bytes, index.first,
                     index.count, index.skipped, index.options);
  if (!index.sources.empty()) out += fmt::format("#sources {}\n", index.sources);
  for (const auto& r : index.records)
    out += fmt::format("{} {} {} {:08x} {} {} {} {}\n", r.key, r.offset, r.size, r.crc32, r.label, r.width, r.height,
                       codec_names(r.codec).index_name);
  return out;
}

}  // namespace rn

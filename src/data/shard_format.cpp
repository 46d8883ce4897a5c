#include "data/shard_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_util.h"

namespace rn {

std::string shard_tar_name(int64_t shard) { return fmt::format("shard-{:05d}.tar", shard); }
std::string shard_index_name(int64_t shard) { return fmt::format("shard-{:05d}.idx", shard); }

namespace {

// Writes `value` as zero-padded octal filling width - 1 digits and a NUL.
void put_octal(uint8_t* field, size_t width, uint64_t value) {
  const std::string digits = fmt::format("{:0{}o}", value, width - 1);
  RN_CHECK(digits.size() == width - 1) << "value " << value << " does not fit a tar header field";
  std::memcpy(field, digits.data(), digits.size());
  field[width - 1] = 0;
}

}  // namespace

std::array<uint8_t, kTarBlock> make_tar_header(std::string_view name, uint64_t size) {
  RN_CHECK(!name.empty() && name.size() <= 100) << "tar member name '" << name << "' must be 1..100 bytes";
  std::array<uint8_t, kTarBlock> h{};
  std::memcpy(h.data(), name.data(), name.size());
  put_octal(h.data() + 100, 8, 0644);  // mode
  put_octal(h.data() + 108, 8, 0);     // uid
  put_octal(h.data() + 116, 8, 0);     // gid
  put_octal(h.data() + 124, 12, size);
  put_octal(h.data() + 136, 12, 0);  // mtime
  h[156] = '0';                      // regular file
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  // The checksum is the byte sum with its own field taken as spaces.
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (uint8_t b : h) sum += b;
  const std::string chk = fmt::format("{:06o}", sum);
  std::memcpy(h.data() + 148, chk.data(), 6);
  h[154] = 0;
  h[155] = ' ';
  return h;
}

std::string make_npy_header(int height, int width) {
  std::string dict = fmt::format("{{'descr': '|u1', 'fortran_order': False, 'shape': ({}, {}, 3), }}", height, width);
  // magic (6) + version (2) + length (2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  return header + dict;
}

size_t parse_npy_header(std::span<const uint8_t> bytes, int height, int width) {
  RN_CHECK(bytes.size() >= 10 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0)
      << "not a .npy record (no \\x93NUMPY magic)";
  const int major = bytes[6];
  RN_CHECK(major == 1 || major == 2) << ".npy version " << major << "." << int(bytes[7]) << " is not supported";
  size_t len = bytes[8] | (size_t(bytes[9]) << 8);
  size_t start = 10;
  if (major == 2) {
    RN_CHECK(bytes.size() >= 12) << "truncated .npy header";
    len |= (size_t(bytes[10]) << 16) | (size_t(bytes[11]) << 24);
    start = 12;
  }
  RN_CHECK(start + len <= bytes.size()) << "truncated .npy header: " << len << " bytes announced, "
                                        << bytes.size() - start << " present";
  std::string dict(reinterpret_cast<const char*>(bytes.data()) + start, len);
  dict.erase(std::remove_if(dict.begin(), dict.end(), [](char c) { return c == ' ' || c == '\n'; }), dict.end());
  RN_CHECK(dict.find("'descr':'|u1'") != std::string::npos || dict.find("'descr':'u1'") != std::string::npos)
      << ".npy record does not hold uint8 ('descr' is not '|u1'): " << dict;
  RN_CHECK(dict.find("'fortran_order':False") != std::string::npos) << ".npy record is not in C order: " << dict;
  const std::string shape = fmt::format("'shape':({},{},3)", height, width);
  RN_CHECK(dict.find(shape) != std::string::npos)
      << ".npy record's shape is not (" << height << ", " << width << ", 3) as the index says: " << dict;
  const size_t data = start + len;
  const uint64_t want = uint64_t(height) * uint64_t(width) * 3;
  RN_CHECK(bytes.size() - data == want) << ".npy record holds " << bytes.size() - data
                                        << " bytes of pixels, its shape (" << height << ", " << width << ", 3) needs "
                                        << want;
  return data;
}

ShardManifest parse_shard_manifest(std::string_view text, const std::string& file) {
  nlohmann::json j;
  std::string duplicate;
  try {
    j = parse_json_refusing_duplicates(text, duplicate);
  } catch (const nlohmann::json::exception& e) {
    RN_FAIL() << file << ": not valid JSON: " << e.what();
  }
  RN_CHECK(duplicate.empty()) << file << ": the key '" << duplicate << "' is given twice in one object";
  // An integer field of `o` within [lo, hi] (json_util.h: no silent conversion of a double
  // or of a larger integer); `fallback` when absent and optional.
  auto integer = [&](const nlohmann::json& o, const char* key, int64_t lo, int64_t hi,
                     std::optional<int64_t> fallback = std::nullopt) -> int64_t {
    if (fallback && !o.contains(key)) return *fallback;
    const std::optional<int64_t> v = json_integer(o.at(key), lo, hi);
    RN_CHECK(v.has_value()) << file << ": '" << key << "' is " << json_excerpt(o.at(key), 40)
                            << ", expected an integer in [" << lo << ", " << hi << "]";
    return *v;
  };
  ShardManifest m;
  try {
    RN_CHECK(j.is_object()) << file << ": expected a JSON object at the top";
    const std::string format = j.at("format").get<std::string>();
    RN_CHECK(format == kShardFormatName) << file << ": format is '" << format << "', expected '" << kShardFormatName
                                         << "'";
    m.version = static_cast<int>(integer(j, "version", 0, INT32_MAX));
    RN_CHECK(m.version == kShardFormatVersion)
        << file << ": format version " << m.version << " is not supported (this reader reads version "
        << kShardFormatVersion << ")";
    m.classes = j.at("classes").get<std::vector<std::string>>();
    RN_CHECK(!m.classes.empty()) << file << ": 'classes' is empty";
    m.records = integer(j, "records", 0, kJsonMaxCount);
    RN_CHECK(j.at("shards").is_array()) << file << ": 'shards' is " << json_excerpt(j.at("shards"), 40)
                                        << ", expected a list";
    int64_t total = 0;
    for (const auto& s : j.at("shards")) {
      RN_CHECK(s.is_object()) << file << ": shard " << m.shards.size() << " is " << json_excerpt(s, 40)
                              << ", expected an object";
      ShardManifestEntry e;
      e.tar = s.at("tar").get<std::string>();
      e.index = s.at("index").get<std::string>();
      e.records = integer(s, "records", 0, kJsonMaxCount);
      e.tar_bytes = static_cast<uint64_t>(integer(s, "tar_bytes", 0, INT64_MAX));
      for (const std::string* name : {&e.tar, &e.index})
        RN_CHECK(!name->empty() && name->find('/') == std::string::npos && *name != "." && *name != "..")
            << file << ": shard " << m.shards.size() << " names '" << *name
            << "': expected a file name in the same folder";
      total += e.records;  // at most 2^53 each: no overflow before the check below
      RN_CHECK(total <= m.records) << file << ": shards 0.." << m.shards.size() << " hold " << total
                                   << " records, more than the " << m.records << " 'records' says";
      m.shards.push_back(std::move(e));
    }
    RN_CHECK(!m.shards.empty()) << file << ": 'shards' is empty";
    RN_CHECK(total == m.records) << file << ": the shards hold " << total << " records but 'records' says "
                                 << m.records;
    if (j.contains("pack")) {
      const auto& p = j.at("pack");
      RN_CHECK(p.is_object()) << file << ": 'pack' is " << json_excerpt(p, 40) << ", expected an object";
      m.source = p.value("source", "");
      m.max_size = static_cast<int>(integer(p, "max_size", 0, INT32_MAX, 0));
      m.quality = static_cast<int>(integer(p, "quality", 0, 100, 0));
      m.raw = p.value("raw", false);
      m.records_per_shard = integer(p, "records_per_shard", 0, INT64_MAX, 0);  // as given to `resnet pack`
      m.skipped = integer(p, "skipped", 0, kJsonMaxCount, 0);
      const std::string labels = p.value("labels", "names");
      RN_CHECK(labels == "names" || labels == "positions")
          << file << ": 'pack.labels' is '" << labels << "', expected 'names' or 'positions'";
      m.labels_are_positions = labels == "positions";
    }
  } catch (const nlohmann::json::exception& e) {
    RN_FAIL() << file << ": malformed manifest: " << e.what();
  }
  return m;
}

std::string format_shard_manifest(const ShardManifest& m) {
  nlohmann::ordered_json j;
  j["format"] = kShardFormatName;
  j["version"] = m.version;
  j["records"] = m.records;
  j["classes"] = m.classes;
  j["shards"] = nlohmann::ordered_json::array();
  for (const auto& s : m.shards)
    j["shards"].push_back({{"tar", s.tar}, {"index", s.index}, {"records", s.records}, {"tar_bytes", s.tar_bytes}});
  j["pack"] = {{"source", m.source},
               {"max_size", m.max_size},
               {"quality", m.quality},
               {"raw", m.raw},
               {"records_per_shard", m.records_per_shard},
               {"skipped", m.skipped},
               {"labels", m.labels_are_positions ? "positions" : "names"}};
  return j.dump(1) + "\n";
}

}  // namespace rn

#include "model/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/json_util.h"
#include "core/utf8.h"

namespace rn {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // real headers are kilobytes; more is corruption

struct DTypeTag {
  const char* tag;
  size_t size;
  std::optional<DType> dtype;
};

// Every tag of the safetensors spec with a whole-byte element size. Those without an rn::DType
// still load (a torchvision num_batches_tracked is I64) but view() refuses them.
constexpr DTypeTag kTags[] = {
    {"F32", 4, DType::f32}, {"BF16", 2, DType::bf16}, {"F16", 2, DType::f16},   {"I32", 4, DType::i32},
    {"U8", 1, DType::u8},   {"I64", 8, std::nullopt}, {"F64", 8, std::nullopt}, {"BOOL", 1, std::nullopt},
    {"I8", 1, std::nullopt}, {"I16", 2, std::nullopt}, {"U16", 2, std::nullopt}, {"U32", 4, std::nullopt},
    {"U64", 8, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeTag* find_tag(const std::string& tag) {
  for (const DTypeTag& t : kTags)
    if (tag == t.tag) return &t;
  return nullptr;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

Shape make_shape(const std::vector<int64_t>& d) {
  switch (d.size()) {
    case 0: return Shape{};
    case 1: return Shape{d[0]};
    case 2: return Shape{d[0], d[1]};
    case 3: return Shape{d[0], d[1], d[2]};
    case 4: return Shape{d[0], d[1], d[2], d[3]};
    case 5: return Shape{d[0], d[1], d[2], d[3], d[4]};
  }
  RN_FAIL() << "rank " << d.size() << " exceeds " << Shape::kMaxRank;
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at the current position; returns false on a short read, errno on error.
bool read_exact(int fd, void* dst, size_t n, int* err) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::read(fd, p, std::min<size_t>(n, 1u << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? errno : 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Parses the header, refusing duplicate keys at any depth (nlohmann would keep the last one).
json parse_header(const std::string& path, const std::string& text) {
  std::string duplicate;
  json header;
  try {
    header = parse_json_refusing_duplicates(text, duplicate);
  } catch (const json::exception& e) {
    RN_FAIL() << "safetensors file '" << path << "': header is not valid JSON: " << printable(e.what());
  }
  RN_CHECK(duplicate.empty()) << "safetensors file '" << path << "': header has the key '" << duplicate
                              << "' twice";
  RN_CHECK(header.is_object()) << "safetensors file '" << path << "': header is a JSON " << header.type_name()
                               << ", expected an object";
  return header;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  RN_CHECK(value.is_object()) << "safetensors file '" << path << "': __metadata__ is a JSON " << value.type_name()
                              << ", expected an object of strings";
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    RN_CHECK(v.is_string()) << "safetensors file '" << path << "': __metadata__ value for '" << key << "' is a JSON "
                            << v.type_name() << ", expected a string";
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// Validates one header entry against itself and the data section size; overlaps are checked later.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value,
                             uint64_t data_bytes) {
  const std::string where = "safetensors file '" + path + "': tensor '" + name + "': ";
  RN_CHECK(!name.empty()) << "safetensors file '" << path << "': a tensor has an empty name";
  RN_CHECK(value.is_object()) << where << "entry is a JSON " << value.type_name() << ", expected an object";
  for (const auto& [key, v] : value.items()) {
    RN_CHECK(key == "dtype" || key == "shape" || key == "data_offsets")
        << where << "unexpected field '" << key << "' (expected dtype, shape, data_offsets)";
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    RN_CHECK(value.contains(field)) << where << "missing field '" << field << "'";
  }

  SafetensorsEntry e;
  e.name = name;
  const json& dtype = value["dtype"];
  RN_CHECK(dtype.is_string()) << where << "dtype is a JSON " << dtype.type_name() << ", expected a string";
  e.dtype_tag = dtype.get<std::string>();
  const DTypeTag* tag = find_tag(e.dtype_tag);
  RN_CHECK(tag != nullptr) << where << "unknown dtype '" << e.dtype_tag
                           << "' (known: F32, BF16, F16, I32, U8, I64, F64, BOOL, I8, I16, U16, U32, U64, F8_E4M3, "
                              "F8_E5M2)";
  e.dtype = tag->dtype;
  e.element_size = tag->size;

  const json& shape = value["shape"];
  RN_CHECK(shape.is_array()) << where << "shape is a JSON " << shape.type_name() << ", expected an array";
  RN_CHECK(shape.size() <= static_cast<size_t>(Shape::kMaxRank))
      << where << "shape " << json_excerpt(shape) << " has rank " << shape.size() << ", more than " << Shape::kMaxRank;
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  bool overflow = false, has_zero = false;
  for (const json& d : shape) {
    RN_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX))
        << where << "shape " << json_excerpt(shape)
        << " has an element that is not a non-negative integer (below 2^63)";
    uint64_t v = d.get<uint64_t>();
    dims.push_back(static_cast<int64_t>(v));
    has_zero = has_zero || v == 0;
    overflow = overflow || __builtin_mul_overflow(numel, v, &numel);
  }
  if (has_zero) numel = 0, overflow = false;
  uint64_t expected_bytes = 0;
  overflow = overflow || numel > static_cast<uint64_t>(INT64_MAX) ||
             __builtin_mul_overflow(numel, static_cast<uint64_t>(e.element_size), &expected_bytes);
  RN_CHECK(!overflow) << where << "shape " << json_excerpt(shape) << " overflows 64-bit arithmetic";
  e.shape = make_shape(dims);

  const json& offsets = value["data_offsets"];
  RN_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
           offsets[1].is_number_unsigned())
      << where << "data_offsets " << json_excerpt(offsets) << " is not an array of two non-negative integers";
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  RN_CHECK(e.begin <= e.end) << where << "data_offsets [" << e.begin << ", " << e.end << "] has begin > end";
  RN_CHECK(e.end <= data_bytes) << where << "data_offsets [" << e.begin << ", " << e.end
                                << "] end past the data section (" << data_bytes << " bytes; file truncated?)";
  RN_CHECK(e.end - e.begin == expected_bytes)
      << where << "size mismatch: data_offsets [" << e.begin << ", " << e.end << "] hold " << (e.end - e.begin)
      << " bytes but " << e.dtype_tag << e.shape.str() << " needs " << expected_bytes;
  return e;
}

// Sorts entries by offset and requires the non-empty ones to tile the data section exactly.
void check_coverage(const std::string& path, std::vector<SafetensorsEntry>& entries, uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.bytes() == 0) continue;
    RN_CHECK(e.begin >= cursor) << "safetensors file '" << path << "': tensor '" << e.name << "': overlapping data: ["
                                << e.begin << ", " << e.end << ") overlaps tensor '" << previous->name << "' ["
                                << previous->begin << ", " << previous->end << ")";
    RN_CHECK(e.begin == cursor) << "safetensors file '" << path << "': bytes [" << cursor << ", " << e.begin
                                << ") of the data section are not covered by any tensor (hole before tensor '"
                                << e.name << "')";
    cursor = e.end;
    previous = &e;
  }
  RN_CHECK(cursor == data_bytes) << "safetensors file '" << path << "': bytes [" << cursor << ", " << data_bytes
                                 << ") at the end of the data section are not covered by any tensor";
}

// Where the 8 hex digits of the header's CRC field start in a header's text, or npos. A string
// value cannot hold this sequence (its quotes would be escaped), so the first match is the field.
size_t header_crc_digits(const std::string& header) {
  const std::string field = "\"" + std::string(kHeaderCrc32Key) + "\":\"";
  const size_t at = header.find(field);
  if (at == std::string::npos || at + field.size() + 8 > header.size()) return std::string::npos;
  return at + field.size();
}

// The CRC-32 of `header` with its CRC digits (at `digits`) read as "00000000".
uint32_t header_crc(std::string header, size_t digits) {
  header.replace(digits, 8, "00000000");
  return static_cast<uint32_t>(
      ::crc32_z(::crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(header.data()), header.size()));
}

}  // namespace

bool reseal_header_crc(std::string& bytes) {
  if (bytes.size() < 8) return false;
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_bytes > bytes.size() - 8) return false;
  std::string header = bytes.substr(8, header_bytes);
  const size_t at = header_crc_digits(header);
  if (at == std::string::npos) return false;
  bytes.replace(8 + at, 8, fmt::format("{:08x}", header_crc(header, at)));
  return true;
}

std::string_view safetensors_dtype_tag(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  RN_FAIL() << "no safetensors tag for dtype " << static_cast<int>(t);
}

SafetensorsFile SafetensorsFile::load(const std::string& path) {
  const std::string where = "safetensors file '" + path + "': ";
  // Checked before the open too: opening a pipe would wait for a writer for ever.
  struct stat before {};
  RN_CHECK(::stat(path.c_str(), &before) != 0 || S_ISREG(before.st_mode)) << where << "not a regular file";
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  int err = errno;  // captured before building a message can disturb it
  RN_CHECK(file.fd >= 0) << where << "cannot open: " << errno_text(err);
  struct stat st {};
  err = ::fstat(file.fd, &st) == 0 ? 0 : errno;
  RN_CHECK(err == 0) << where << "cannot stat: " << errno_text(err);
  RN_CHECK(S_ISREG(st.st_mode)) << where << "not a regular file";
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  RN_CHECK(file_bytes >= 8) << where << "file too short (" << file_bytes
                            << " bytes) to hold the 8-byte header length";

  unsigned char length_bytes[8];
  RN_CHECK(read_exact(file.fd, length_bytes, 8, &err)) << where << "cannot read header length: " << errno_text(err);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxHeaderBytes) {
    // Most often another kind of file given where weights were expected: say so, and show text.
    std::string start;
    for (unsigned char c : length_bytes) start += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '\0';
    const bool text = start.find('\0') == std::string::npos;
    RN_FAIL() << where << "header length " << header_bytes << " is absurd (limit " << kMaxHeaderBytes
              << " bytes): this is not a safetensors file" << (text ? " (it starts with the text '" + start + "')" : "")
              << "; weights are read from safetensors files and PyTorch torch.save files";
  }
  RN_CHECK(header_bytes <= file_bytes - 8) << where << "header length " << header_bytes << " exceeds the file ("
                                           << file_bytes << " bytes; truncated?)";
  std::string text(header_bytes, '\0');
  RN_CHECK(read_exact(file.fd, text.data(), text.size(), &err)) << where << "cannot read header: " << errno_text(err);
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;

  SafetensorsFile f;
  f.path_ = path;
  const json header = parse_header(path, text);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      f.metadata_ = parse_metadata(path, value);
    } else {
      f.entries_.push_back(parse_entry(path, name, value, data_bytes));
    }
  }
  check_coverage(path, f.entries_, data_bytes);

  f.data_ = HostBuffer(static_cast<size_t>(data_bytes));
  RN_CHECK(read_exact(file.fd, f.data_.data(), f.data_.bytes(), &err))
      << where << "cannot read the " << data_bytes << "-byte data section: "
      << (err ? errno_text(err) : std::string("file shrank while reading"));
  if (auto it = f.metadata_.find(std::string(kHeaderCrc32Key)); it != f.metadata_.end()) {
    const size_t at = header_crc_digits(text);
    const std::string crc = at == std::string::npos ? "(no field)" : fmt::format("{:08x}", header_crc(text, at));
    RN_CHECK(crc == it->second) << where << "the header is damaged: its CRC-32 is " << crc << ", the header recorded "
                                << it->second << " when the file was written";
  }
  if (auto it = f.metadata_.find(std::string(kDataCrc32Key)); it != f.metadata_.end()) {
    const auto crc = static_cast<uint32_t>(
        ::crc32_z(::crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(f.data_.data()), f.data_.bytes()));
    RN_CHECK(fmt::format("{:08x}", crc) == it->second)
        << where << "the tensor data is damaged: its CRC-32 is " << fmt::format("{:08x}", crc)
        << ", the header recorded " << it->second << " when the file was written";
  }

  for (size_t i = 0; i < f.entries_.size(); ++i) {
    const SafetensorsEntry& e = f.entries_[i];
    f.index_[e.name] = i;
    const std::byte* p = static_cast<const std::byte*>(f.data_.data()) + e.begin;
    if (e.begin % e.element_size != 0) {  // the data section is 64-aligned, so only the offset matters
      HostBuffer& copy = f.realigned_.emplace_back(static_cast<size_t>(e.bytes()));
      std::memcpy(copy.data(), p, static_cast<size_t>(e.bytes()));
      p = static_cast<const std::byte*>(copy.data());
    }
    f.address_.push_back(p);
  }
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsFile::require(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  RN_CHECK(e != nullptr) << "safetensors file '" << path_ << "': no tensor named '" << name << "' ("
                         << entries_.size() << " tensors in the file)";
  return *e;
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry& e = require(name);
  RN_CHECK(e.dtype.has_value()) << "safetensors file '" << path_ << "': tensor '" << name << "' has dtype "
                                << e.dtype_tag << ", which has no rn::DType (read it with raw() instead)";
  Tensor t;
  t.data = const_cast<std::byte*>(address_[index_.at(name)]);
  t.shape = e.shape;
  t.dtype = *e.dtype;
  return t;
}

std::span<const std::byte> SafetensorsFile::raw(const std::string& name) const {
  const SafetensorsEntry& e = require(name);
  return {address_[index_.at(name)], static_cast<size_t>(e.bytes())};
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

struct Planned {
  const std::string* name;
  const Tensor* tensor;
  uint64_t begin, end;
};

std::vector<Planned> plan_layout(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const std::string where = "writing safetensors file '" + path + "': ";
  std::set<std::string> seen;
  std::vector<Planned> plan;
  for (const auto& [name, t] : tensors) {
    RN_CHECK(!name.empty()) << where << "a tensor has an empty name";
    RN_CHECK(name != "__metadata__") << where << "'__metadata__' is reserved and cannot name a tensor";
    RN_CHECK(seen.insert(name).second) << where << "tensor name '" << name << "' appears twice";
    RN_CHECK(t.device == Device::cpu) << where << "tensor '" << name << "' is on " << device_name(t.device)
                                      << "; copy it to the host first";
    RN_CHECK(t.shape.rank() != 4 || t.layout == Layout::nchw)
        << where << "tensor '" << name << "' is " << t.str() << "; the format stores nchw, convert it first";
    RN_CHECK(t.data != nullptr || t.bytes() == 0) << where << "tensor '" << name << "' has no data";
    plan.push_back({&name, &t, 0, 0});
  }
  // Larger elements first keeps every offset a multiple of its element size without padding.
  std::stable_sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    return dtype_size(a.tensor->dtype) > dtype_size(b.tensor->dtype);
  });
  uint64_t offset = 0;
  for (Planned& p : plan) {
    p.begin = offset;
    offset += p.tensor->bytes();
    p.end = offset;
  }
  return plan;
}

std::string build_header(const std::string& path, const std::vector<Planned>& plan,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const Planned& p : plan) {
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype_tag(p.tensor->dtype);
    entry["shape"] = nlohmann::ordered_json::array();
    for (int i = 0; i < p.tensor->shape.rank(); ++i) entry["shape"].push_back(p.tensor->shape[i]);
    entry["data_offsets"] = {p.begin, p.end};
    header[*p.name] = std::move(entry);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    RN_FAIL() << "writing safetensors file '" << path << "': cannot encode the header: " << e.what();
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-aligned in the file
  return text;
}

bool write_all(int fd, const void* src, size_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Creates `<path>.tmp.<pid>.<n>` exclusively, with default permissions (0666 less the umask).
int create_temporary(const std::string& path, std::string* tmp_path) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    *tmp_path = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    int fd = ::open(tmp_path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata_in) {
  const std::vector<Planned> plan = plan_layout(path, tensors);
  // The data section's CRC-32, so that a reader finds damage the format's checks cannot see
  // (a flipped bit in a tensor).
  std::map<std::string, std::string> metadata = metadata_in;
  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  for (const Planned& p : plan) crc = ::crc32_z(crc, static_cast<const Bytef*>(p.tensor->data), p.tensor->bytes());
  metadata[std::string(kDataCrc32Key)] = fmt::format("{:08x}", static_cast<uint32_t>(crc));
  metadata[std::string(kHeaderCrc32Key)] = "00000000";
  std::string header = build_header(path, plan, metadata);
  const size_t at = header_crc_digits(header);
  RN_CHECK(at != std::string::npos) << "writing safetensors file '" << path << "': the header's CRC field is missing";
  header.replace(at, 8, fmt::format("{:08x}", header_crc(header, at)));

  // A symbolic link is kept and its target replaced; a device or a pipe cannot be replaced.
  RN_CHECK(!is_special_file(path)) << "writing safetensors file '" << path
                                   << "': it is a device, a pipe or a socket, not a file; give a file name";
  const std::string target = output_target(path);
  std::string tmp;
  Fd file{create_temporary(target, &tmp)};
  const int create_err = errno;
  RN_CHECK(file.fd >= 0) << "writing safetensors file '" << path << "': cannot create temporary '" << tmp
                         << "': " << errno_text(create_err);
  // Any failure from here on removes the temporary; the target is untouched until the rename.
  auto fail = [&](const char* step) {
    int err = errno;
    ::close(file.fd);
    file.fd = -1;
    ::unlink(tmp.c_str());
    RN_FAIL() << "writing safetensors file '" << path << "': " << step << " failed: " << errno_text(err);
  };
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  if (!write_all(file.fd, length, 8) || !write_all(file.fd, header.data(), header.size())) fail("write header");
  for (const Planned& p : plan) {
    if (!write_all(file.fd, p.tensor->data, p.tensor->bytes())) fail("write tensor data");
  }
  if (::fsync(file.fd) != 0) fail("fsync");
  int closed = ::close(file.fd);
  file.fd = -1;
  if (closed != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    RN_FAIL() << "writing safetensors file '" << path << "': close failed: " << errno_text(err);
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    RN_FAIL() << "writing safetensors file '" << path << "': rename from '" << tmp << "' failed: " << errno_text(err);
  }
  // Make the rename itself durable. The data is already safe; a failure here is reported all the same.
  std::string dir = std::filesystem::path(target).parent_path().string();
  Fd dir_fd{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  const int dir_err = dir_fd.fd < 0 || ::fsync(dir_fd.fd) != 0 ? errno : 0;
  RN_CHECK(dir_err == 0) << "writing safetensors file '" << path << "': fsync of directory '" << dir
                         << "' failed: " << errno_text(dir_err);
}

}  // namespace rn

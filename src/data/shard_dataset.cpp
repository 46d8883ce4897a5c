#include "data/shard_dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/atomic_file.h"
#include "core/check.h"
#include "data/shard_index.h"

namespace rn {

static_assert(kMaxShardKeySize <= 255, "Record::key_size is one byte");

namespace {

// A tar truncated under a running job turns a read of its mapping into SIGBUS. The handler
// finds the mapping the fault is in and says which shard changed, instead of a bare "Bus
// error"; it can only write and exit (async-signal-safe), so train.log does not get the line.
struct MappedShard {
  std::atomic<const uint8_t*> base{nullptr};
  size_t size = 0;
  char message[768] = {};
  size_t message_size = 0;
};
constexpr int kMaxMappedShards = 8192;
MappedShard g_mapped[kMaxMappedShards];
std::atomic<int> g_mapped_count{0};
struct sigaction g_previous_sigbus {};

void on_sigbus(int, siginfo_t* info, void*) {
  const auto* at = static_cast<const uint8_t*>(info->si_addr);
  const int n = std::min(g_mapped_count.load(), kMaxMappedShards);
  for (int i = 0; i < n; ++i) {
    const uint8_t* base = g_mapped[i].base.load();
    if (base != nullptr && at >= base && at < base + g_mapped[i].size) {
      [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, g_mapped[i].message, g_mapped[i].message_size);
      ::_exit(1);
    }
  }
  // Not a shard: the handler that was there before (the default dumps core) takes the fault
  // when the instruction runs again.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
}

int register_mapping(const uint8_t* base, size_t size, const std::string& path) {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
  }();
  const int slot = g_mapped_count.fetch_add(1);
  if (!installed || slot >= kMaxMappedShards) return -1;
  MappedShard& m = g_mapped[slot];
  m.size = size;
  const std::string text = fmt::format(
      "\nresnet: error: shard '{}' shrank or was rewritten while in use (a read fell past its end): a packed folder "
      "must not change under a running job (resnet pack renames finished shards into place, which is safe); the "
      "run's last checkpoint is intact\n",
      path);
  m.message_size = std::min(text.size(), sizeof(m.message));
  std::memcpy(m.message, text.data(), m.message_size);
  m.base.store(base);
  return slot;
}

}  // namespace

// A whole file mapped read-only.
struct ShardDataset::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;

  Mapping(const std::string& path, uint64_t expected_size, const std::string& index_path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    RN_CHECK(fd >= 0) << "cannot open shard '" << path << "': " << std::strerror(errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      RN_FAIL() << "shard '" << path << "' is not a regular file";
    }
    if (static_cast<uint64_t>(st.st_size) != expected_size) {
      ::close(fd);
      RN_FAIL() << "shard '" << path << "' is " << st.st_size << " bytes but its index '" << index_path << "' says "
                << expected_size << ": the tar was truncated or replaced after packing";
    }
    size = static_cast<size_t>(st.st_size);
    void* p = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    RN_CHECK(size > 0 && p != MAP_FAILED) << "cannot map shard '" << path << "' (" << size
                                          << " bytes): " << (size == 0 ? "empty file" : std::strerror(err));
    data = static_cast<const uint8_t*>(p);
    slot = register_mapping(data, size, path);
  }
  ~Mapping() {
    if (slot >= 0) g_mapped[slot].base.store(nullptr);
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
  int slot = -1;  // in g_mapped, or -1
};

ShardDataset::ShardDataset(const std::string& dir, ShardDatasetOptions options) : dir_(dir), options_(options) {
  const std::string manifest_path = (std::filesystem::path(dir) / kShardManifestName).string();
  std::error_code ec;
  RN_CHECK(std::filesystem::exists(manifest_path, ec))
      << "'" << manifest_path << "' is missing: '" << dir << "' is not a folder packed by `resnet pack` "
      << "(or packing did not finish)";
  manifest_ = parse_shard_manifest(read_text_file(manifest_path), manifest_path);
  // The manifest's count is not trusted for an allocation before the indexes confirm it.
  records_.reserve(static_cast<size_t>(std::min<int64_t>(manifest_.records, int64_t{1} << 20)));
  for (size_t s = 0; s < manifest_.shards.size(); ++s) open_shard(s);

  // Keys are unique over the whole dataset, so that "shard:key" names one record.
  std::vector<uint32_t> order(records_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
  for (size_t i = 1; i < order.size(); ++i)
    RN_CHECK(key(order[i]) != key(order[i - 1]))
        << "'" << dir << "': key '" << key(order[i]) << "' appears twice, in "
        << source(std::min(order[i], order[i - 1])) << " and " << source(std::max(order[i], order[i - 1]));
}

ShardDataset::~ShardDataset() = default;

void ShardDataset::open_shard(size_t s) {
  const ShardManifestEntry& entry = manifest_.shards[s];
  const std::filesystem::path folder(dir_);
  const std::string index_path = (folder / entry.index).string();
  const ShardIndex index = parse_shard_index(read_text_file(index_path), index_path);
  RN_CHECK(index.tar == entry.tar) << index_path << ": indexes '" << index.tar << "' but dataset.json pairs it with '"
                                   << entry.tar << "'";
  RN_CHECK(static_cast<int64_t>(index.records.size()) == entry.records)
      << index_path << ": holds " << index.records.size() << " records, dataset.json says " << entry.records;
  RN_CHECK(index.tar_bytes == entry.tar_bytes)
      << index_path << ": says its tar is " << index.tar_bytes << " bytes, dataset.json says " << entry.tar_bytes;
  maps_.push_back(std::make_unique<Mapping>((folder / entry.tar).string(), index.tar_bytes, index_path));

  const int classes = static_cast<int>(manifest_.classes.size());
  for (const ShardIndexRecord& r : index.records) {
    RN_CHECK(r.label < classes) << index_path << ": record '" << r.key << "' has label " << r.label << ", outside the "
                                << classes << " classes of dataset.json";
    records_.push_back({keys_.size(), r.offset, r.size, r.crc32, static_cast<uint32_t>(s), r.label, r.width, r.height,
                        r.codec, static_cast<uint8_t>(r.key.size())});
    keys_ += r.key;
  }
}

std::string ShardDataset::source(int64_t index) const {
  const Record& r = records_[static_cast<size_t>(index)];
  // The folder too: train/ and val/ of one pack each have a shard-00000.tar, with the same keys.
  return (std::filesystem::path(dir_) / manifest_.shards[r.shard].tar).string() + ":" + std::string(key_of(r));
}

int ShardDataset::read(int64_t index, EncodedImage& out) const {
  RN_CHECK(index >= 0 && index < size()) << "index " << index << " outside " << name() << " (size " << size() << ")";
  const Record& r = records_[static_cast<size_t>(index)];
  const std::span<const uint8_t> bytes(maps_[r.shard]->data + r.offset, r.size);
  if (options_.verify_checksums) {
    const auto crc = static_cast<uint32_t>(::crc32_z(0, bytes.data(), bytes.size()));
    RN_CHECK(crc == r.crc32) << source(index) << ": checksum mismatch (CRC32 of the " << r.size << " bytes is "
                             << fmt::format("{:08x}", crc) << ", the index says " << fmt::format("{:08x}", r.crc32)
                             << "): the shard is corrupt";
  }
  out.codec = r.codec;
  out.raw_width = 0;
  out.raw_height = 0;
  out.bytes = bytes;
  if (r.codec == ImageCodec::raw) {
    try {
      out.bytes = bytes.subspan(parse_npy_header(bytes, r.height, r.width));
    } catch (const Error& e) {
      RN_FAIL() << source(index) << ": " << e.what();
    }
    out.raw_width = r.width;
    out.raw_height = r.height;
  }
  return r.label;
}

}  // namespace rn

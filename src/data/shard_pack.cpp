#include "data/shard_pack.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <unordered_set>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/log.h"
#include "data/augment.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/image_resize.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/shard_index.h"

namespace rn {
namespace fs = std::filesystem;

namespace {

std::string sanitize_key(std::string_view s) {
  std::string key(s);
  for (char& c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '/';
    if (!ok) c = '_';
  }
  // No empty path parts and no leading or trailing '/'.
  std::string out;
  for (char c : key)
    if (c != '/' || (!out.empty() && out.back() != '/')) out += c;
  while (!out.empty() && out.back() == '/') out.pop_back();
  return out;
}

// "a/b.c.JPEG" -> "a/b.c": the extension is what follows the last dot of the file name.
std::string strip_extension(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  return dot != std::string::npos && (slash == std::string::npos || dot > slash) ? path.substr(0, dot) : path;
}

std::string options_fingerprint(const PackOptions& o, int64_t records_per_shard) {
  return fmt::format("max_size={} quality={} raw={} records_per_shard={}", o.max_short_side, o.quality, o.raw ? 1 : 0,
                     records_per_shard);
}

// One worker's buffers, reused for every record.
class RecordPacker {
 public:
  explicit RecordPacker(const PackOptions& o) : o_(o) {}

  // Reads and converts record `i`; fills `rec` (all but key and offset) and returns the
  // bytes to store, valid until the next call.
  std::span<const uint8_t> pack(const EncodedDataset& src, int64_t i, ShardIndexRecord& rec, uint64_t& bytes_in) {
    rec.label = src.read(i, enc_);
    bytes_in += enc_.bytes.size();
    const ImageInfo info = image_info(enc_);
    int w = 0, h = 0;
    fit_shorter_side(info.width, info.height, o_.max_short_side, &w, &h);
    const bool resize = w != info.width || h != info.height;
    if (!o_.raw && !resize && (info.codec == ImageCodec::jpeg || info.codec == ImageCodec::png)) {
      // Kept as it is; decoded (JPEG at 1/8 scale, cheaply) only to reject corrupt files.
      decode_image(enc_, DecodeRequest{.min_width = 1, .min_height = 1}, scratch_.decoded);
      return finish(rec, enc_.bytes, info.codec, info.width, info.height);
    }
    decode_fitted(enc_, o_.max_short_side, scratch_, resized_, &w, &h);
    const uint8_t* pixels = resized_.data();
    if (o_.raw) {
      const std::string header = make_npy_header(h, w);
      out_.assign(header.begin(), header.end());
      out_.insert(out_.end(), pixels, pixels + static_cast<size_t>(w) * h * 3);
    } else {
      encode_jpeg(pixels, w, h, o_.quality, out_);
    }
    return finish(rec, out_, o_.raw ? ImageCodec::raw : ImageCodec::jpeg, w, h);
  }

 private:
  static std::span<const uint8_t> finish(ShardIndexRecord& rec, std::span<const uint8_t> bytes, ImageCodec codec, int w,
                                         int h) {
    rec.codec = codec;
    rec.width = w;
    rec.height = h;
    rec.size = bytes.size();
    rec.crc32 = static_cast<uint32_t>(::crc32_z(0, bytes.data(), bytes.size()));
    return bytes;
  }

  const PackOptions& o_;
  EncodedImage enc_;
  AugmentScratch scratch_;
  std::vector<uint8_t> resized_, out_;
};

// A file written under a temporary name, removed unless committed.
class TempOutput {
 public:
  explicit TempOutput(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "wb");
    RN_CHECK(file_ != nullptr) << "cannot create '" << path_ << "': " << std::strerror(errno);
  }
  ~TempOutput() {
    if (file_) std::fclose(file_);
    if (!committed_) ::unlink(path_.c_str());
  }
  void write(const void* data, size_t size) {
    RN_CHECK(size == 0 || std::fwrite(data, 1, size, file_) == size)
        << "cannot write '" << path_ << "': " << std::strerror(errno);
    bytes_ += size;
  }
  uint64_t bytes() const { return bytes_; }
  // Flushes and fsyncs, then closes.
  void close() {
    RN_CHECK(std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0)
        << "cannot write '" << path_ << "': " << std::strerror(errno);
    const int rc = std::fclose(file_);
    file_ = nullptr;
    RN_CHECK(rc == 0) << "cannot write '" << path_ << "': " << std::strerror(errno);
  }
  void rename_to(const std::string& dest) {
    RN_CHECK(::rename(path_.c_str(), dest.c_str()) == 0)
        << "cannot rename '" << path_ << "' to '" << dest << "': " << std::strerror(errno);
    committed_ = true;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t bytes_ = 0;
  bool committed_ = false;
};

void write_tar_member(TempOutput& tar, const std::string& name, std::span<const uint8_t> data) {
  static const uint8_t kZeros[kTarBlock] = {};
  const auto header = make_tar_header(name, data.size());
  tar.write(header.data(), header.size());
  tar.write(data.data(), data.size());
  tar.write(kZeros, tar_padded_size(data.size()) - data.size());
}

struct Plan {
  const EncodedDataset& src;
  const PackOptions& options;
  const std::vector<std::string>& keys;
  int64_t records_per_shard;
  int64_t shards;
  std::string fingerprint;

  int64_t first(int64_t shard) const { return shard * records_per_shard; }
  int64_t count(int64_t shard) const {
    return std::min(records_per_shard, static_cast<int64_t>(keys.size()) - first(shard));
  }
  std::string path(const std::string& name) const { return (fs::path(options.out_dir) / name).string(); }
};

// Counters shared by the workers and the thread reporting progress.
struct Shared {
  std::atomic<int64_t> next_shard{0};
  std::atomic<int64_t> records_done{0};
  std::atomic<int64_t> shards_done{0};
  std::atomic<int64_t> shards_written{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable changed;
  int workers_running = 0;
  std::exception_ptr error;
};

struct ShardOutcome {
  ShardIndex index;
  bool reused = false;
  uint64_t bytes_in = 0;
  std::vector<std::string> skipped;
};

// The index of a complete shard from an earlier run that this run would write the same
// way, or nothing (the shard is then packed again).
// The sizes and modification times of a shard's source files, hashed (FNV-1a): a rerun
// repacks a shard whose files were edited in place. A record of a pack being packed again
// counts by what its index says of it (CRC-32, size, label): a source pack packed again with
// other labels or pixels under the same keys is not taken for the one packed before.
std::string source_fingerprint(const EncodedDataset& src, int64_t first, int64_t count) {
  const auto* pack = dynamic_cast<const ShardDataset*>(&src);
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (int64_t i = first; i < first + count; ++i) {
    if (pack) {
      mix(pack->content_hash(i));
      continue;
    }
    struct stat st {};
    if (::stat(src.source(i).c_str(), &st) != 0) {
      mix(0);
      continue;
    }
    mix(static_cast<uint64_t>(st.st_size));
    mix(static_cast<uint64_t>(st.st_mtim.tv_sec));
    mix(static_cast<uint64_t>(st.st_mtim.tv_nsec));
  }
  return fmt::format("{:016x}", h);
}

std::optional<ShardIndex> reusable_shard(const Plan& plan, int64_t shard) {
  const std::string index_path = plan.path(shard_index_name(shard));
  std::error_code missing;
  if (!fs::exists(index_path, missing)) return std::nullopt;
  try {
    ShardIndex index = parse_shard_index(read_text_file(index_path), index_path);
    const std::string tar_path = plan.path(shard_tar_name(shard));
    std::error_code ec;
    const uint64_t tar_size = fs::file_size(tar_path, ec);
    const bool same = !ec && index.tar == shard_tar_name(shard) && tar_size == index.tar_bytes &&
                      index.options == plan.fingerprint && index.first == plan.first(shard) &&
                      index.count == plan.count(shard) &&
                      index.sources == source_fingerprint(plan.src, plan.first(shard), plan.count(shard));
    // Its keys are the shard's expected keys, in order, less the skipped ones; where labels
    // are known without reading (image folders, list files), they match too.
    const auto* folder = dynamic_cast<const ImageFolderDataset*>(&plan.src);
    size_t k = static_cast<size_t>(plan.first(shard));
    const size_t end = k + static_cast<size_t>(plan.count(shard));
    bool keys_match = same;
    for (size_t r = 0; keys_match && r < index.records.size(); ++r, ++k) {
      while (k < end && plan.keys[k] != index.records[r].key) ++k;
      keys_match = k < end && (!folder || folder->label(static_cast<int64_t>(k)) == index.records[r].label);
    }
    if (same && keys_match) return index;
    RN_LOG_INFO(
        "pack: {} is from a different pack (options, files, labels, sizes or the files' modification times "
        "differ); packing it again",
        index_path);
  } catch (const Error& e) {
    RN_LOG_INFO("pack: {} is not a complete shard ({}); packing it again", index_path, e.what());
  }
  return std::nullopt;
}

ShardOutcome write_shard(const Plan& plan, int64_t shard, RecordPacker& packer, Shared& shared) {
  ShardOutcome out;
  ShardIndex& index = out.index;
  index.tar = shard_tar_name(shard);
  index.options = plan.fingerprint;
  index.first = plan.first(shard);
  index.count = plan.count(shard);
  // Taken before the files are read: one edited while it is packed is packed again next time.
  index.sources = source_fingerprint(plan.src, index.first, index.count);
  const std::string tar_path = plan.path(index.tar), index_path = plan.path(shard_index_name(shard));
  TempOutput tar(tar_path + ".tmp");
  for (int64_t i = index.first; i < index.first + index.count; ++i) {
    if (shared.stop.load()) RN_FAIL() << "pack stopped";
    ShardIndexRecord rec;
    rec.key = plan.keys[static_cast<size_t>(i)];
    std::span<const uint8_t> bytes;
    try {
      bytes = packer.pack(plan.src, i, rec, out.bytes_in);
    } catch (const std::exception& e) {  // any failure of one file is that file's
      if (plan.options.strict) RN_FAIL() << plan.src.source(i) << ": " << e.what();
      RN_LOG_WARN("pack: skipping {}: {}", plan.src.source(i), e.what());
      out.skipped.push_back(plan.src.source(i));
      ++index.skipped;
      shared.records_done.fetch_add(1);
      continue;
    }
    rec.offset = tar.bytes() + kTarBlock;
    write_tar_member(tar, rec.key + "." + std::string(shard_member_extension(rec.codec)), bytes);
    const std::string label = std::to_string(rec.label);
    write_tar_member(tar, rec.key + ".cls", {reinterpret_cast<const uint8_t*>(label.data()), label.size()});
    index.records.push_back(std::move(rec));
    shared.records_done.fetch_add(1);
  }
  static const uint8_t kEnd[2 * kTarBlock] = {};
  tar.write(kEnd, sizeof(kEnd));
  index.tar_bytes = tar.bytes();
  tar.close();

  TempOutput idx(index_path + ".tmp");
  const std::string text = format_shard_index(index);
  idx.write(text.data(), text.size());
  idx.close();
  // An index names a complete tar: remove the old index before the old tar is replaced,
  // and put the new index in place only after the new tar.
  RN_CHECK(::unlink(index_path.c_str()) == 0 || errno == ENOENT)
      << "cannot remove '" << index_path << "': " << std::strerror(errno);
  // Synced in between so that no file system may make the index's rename durable first.
  tar.rename_to(tar_path);
  fsync_folder(plan.options.out_dir, tar_path);
  idx.rename_to(index_path);
  fsync_folder(plan.options.out_dir, index_path);
  return out;
}

void run_worker(const Plan& plan, Shared& shared, std::vector<ShardOutcome>& outcomes) {
  try {
    RecordPacker packer(plan.options);
    for (int64_t s; !shared.stop.load() && (s = shared.next_shard.fetch_add(1)) < plan.shards;) {
      ShardOutcome& out = outcomes[static_cast<size_t>(s)];
      if (auto index = reusable_shard(plan, s)) {
        out.index = std::move(*index);
        out.reused = true;
        shared.records_done.fetch_add(out.index.count);
      } else {
        out = write_shard(plan, s, packer, shared);
        const int64_t written = shared.shards_written.fetch_add(1) + 1;
        if (plan.options.stop_after_shards >= 0 && written >= plan.options.stop_after_shards) shared.stop = true;
      }
      shared.bytes_out.fetch_add(out.index.tar_bytes);
      shared.shards_done.fetch_add(1);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(shared.mu);
    if (!shared.error) shared.error = std::current_exception();
    shared.stop = true;
  }
  std::lock_guard<std::mutex> lock(shared.mu);
  --shared.workers_running;
  shared.changed.notify_all();
}

// Removes what an interrupted or earlier pack may have left that this pack will not keep:
// .tmp files, shards beyond the new count, and dataset.json (written again at the end).
void clean_output_folder(const PackOptions& o, int64_t shards) {
  static const std::regex shard_file(R"(shard-(\d{5,})\.(tar|idx))");
  static const std::regex temp_file(R"((shard-\d{5,}\.(tar|idx)\.tmp)|(\.dataset\.json\.tmp\..*))");
  for (const auto& entry : fs::directory_iterator(o.out_dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    const bool stale = std::regex_match(name, temp_file) ||
                       (std::regex_match(name, m, shard_file) && std::stoll(m[1].str()) >= shards) ||
                       name == kShardManifestName;
    if (stale) {
      RN_LOG_DEBUG("pack: removing {}", entry.path().string());
      fs::remove(entry.path());
    }
  }
}

// Records per shard for about `target` bytes, from the packed size of up to 64 records
// spread over the dataset (deterministic, so that a rerun splits the same way).
int64_t choose_records_per_shard(const EncodedDataset& src, const PackOptions& o) {
  const int64_t n = src.size(), samples = std::min<int64_t>(n, 64);
  // More records per shard than the dataset holds is one shard (and no overflow below).
  if (o.records_per_shard > 0) return std::min(o.records_per_shard, std::max<int64_t>(n, 1));
  RecordPacker packer(o);
  uint64_t bytes = 0, ignored = 0;
  int64_t ok = 0;
  for (int64_t j = 0; j < samples; ++j) {
    ShardIndexRecord rec;
    try {
      packer.pack(src, j * n / samples, rec, ignored);
    } catch (const Error&) {
      continue;
    }
    bytes += tar_padded_size(rec.size) + 3 * kTarBlock;  // two headers and the .cls block
    ++ok;
  }
  if (ok == 0) return n;
  return std::clamp<int64_t>(static_cast<int64_t>(o.target_shard_bytes / std::max<uint64_t>(1, bytes / ok)), 1, n);
}

// "imagefolder:ROOT" with ROOT made absolute, so that the same folder named from another
// working directory (or with ./ or ..) compares equal.
std::string comparable_source(const std::string& source) {
  const size_t colon = source.find(':');
  if (colon == std::string::npos) return source;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(source.substr(colon + 1)), ec);
  return ec ? source : source.substr(0, colon + 1) + p.string();
}

// What the output folder may already hold. Folders: never (a folder with dataset.json reads as
// the pack, which would hide them). A finished pack of another source, or shard files that no
// unfinished pack of ours left, would be replaced or deleted: that takes --overwrite. A pack of
// the same source, or an unfinished one, is a rerun (complete shards are kept).
void check_output_folder(const EncodedDataset& src, const PackOptions& o) {
  const fs::path manifest_path = fs::path(o.out_dir) / kShardManifestName;
  std::error_code ec;
  if (!fs::is_directory(o.out_dir, ec)) return;
  static const std::regex shard_file(R"(shard-\d{5,}\.(tar|idx)(\.tmp)?)");
  std::string folder, shard;
  for (const auto& entry : fs::directory_iterator(o.out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && folder.empty()) folder = name;
    if (std::regex_match(name, shard_file) && shard.empty()) shard = name;
  }
  RN_CHECK(folder.empty()) << "pack: the output folder '" << o.out_dir << "' holds folders ('" << folder
                           << "/'); a packed folder holds its shards and dataset.json only, and would hide them "
                              "from every reader: give a new or empty folder";
  if (o.overwrite) return;
  if (!fs::exists(manifest_path, ec)) {
    RN_CHECK(shard.empty() || fs::exists(fs::path(o.out_dir) / kPackMarker, ec))
        << "pack: the output folder '" << o.out_dir << "' holds shard files ('" << shard
        << "') that no unfinished resnet pack left (no dataset.json, no " << kPackMarker
        << "): give another folder, or --overwrite to replace them";
    return;
  }
  ShardManifest earlier;
  try {
    earlier = parse_shard_manifest(read_text_file(manifest_path.string()), manifest_path.string());
  } catch (const Error& e) {
    RN_FAIL() << "pack: " << o.out_dir << " holds a " << kShardManifestName << " that cannot be read (" << e.what()
              << "); give an empty folder, or --overwrite to pack over it";
  }
  if (comparable_source(earlier.source) == comparable_source(src.name())) return;
  RN_FAIL() << "pack: " << o.out_dir << " already holds a pack of " << earlier.source << " (" << earlier.records
            << " records, " << earlier.classes.size() << " classes); packing " << src.name()
            << " there would replace it: give another folder, or --overwrite to replace it";
}

}  // namespace

std::vector<std::string> pack_keys(const EncodedDataset& src) {
  const auto* folder = dynamic_cast<const ImageFolderDataset*>(&src);
  const auto* shards = dynamic_cast<const ShardDataset*>(&src);
  const int64_t n = src.size();
  std::vector<std::string> keys(static_cast<size_t>(n));
  std::unordered_set<std::string> seen;
  for (int64_t i = 0; i < n; ++i) {
    std::string key = folder   ? sanitize_key(strip_extension(folder->relative_path(i)))
                      : shards ? std::string(shards->key(i))
                               : fmt::format("{:09d}", i);
    // Too long for a tar name, or two files that differ only in characters we replaced.
    if (!is_valid_shard_key(key) || seen.count(key)) key = sanitize_key(key.substr(0, 60)) + fmt::format("_{:09d}", i);
    RN_CHECK(is_valid_shard_key(key) && seen.insert(key).second) << "cannot make a unique key for " << src.source(i);
    keys[static_cast<size_t>(i)] = std::move(key);
  }
  return keys;
}

PackResult pack_shards(const EncodedDataset& src, const PackOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  RN_CHECK(!o.out_dir.empty()) << "pack: no output folder";
  RN_CHECK(o.quality >= 1 && o.quality <= 100) << "pack: JPEG quality " << o.quality << " is outside 1..100";
  RN_CHECK(o.max_short_side >= 0) << "pack: negative maximum size " << o.max_short_side;
  RN_CHECK(src.size() > 0) << "pack: " << src.name() << " is empty";
  check_output_folder(src, o);
  std::error_code ec;
  RN_CHECK(!fs::exists(o.out_dir, ec) || fs::is_directory(o.out_dir, ec))
      << "pack: the output '" << o.out_dir << "' is a file, not a folder: give a folder for the shards";
  fs::create_directories(o.out_dir, ec);
  RN_CHECK(!ec && fs::is_directory(o.out_dir)) << "pack: cannot create the output folder '" << o.out_dir
                                               << "': " << (ec ? ec.message() : "a file of that name exists");
  write_file_atomic((fs::path(o.out_dir) / kPackMarker).string(), src.name() + "\n");

  const std::vector<std::string> keys = pack_keys(src);
  const int64_t rps = choose_records_per_shard(src, o);
  const Plan plan{src, o, keys, rps, (src.size() + rps - 1) / rps, options_fingerprint(o, rps)};
  try {
    clean_output_folder(o, plan.shards);
  } catch (const fs::filesystem_error& e) {
    RN_FAIL() << "pack: cannot clean the output folder '" << o.out_dir << "': " << e.what();
  }

  Shared shared;
  std::vector<ShardOutcome> outcomes(static_cast<size_t>(plan.shards));
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = static_cast<int>(std::min<int64_t>(o.workers > 0 ? o.workers : hw, plan.shards));
  shared.workers_running = workers;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back(run_worker, std::cref(plan), std::ref(shared), std::ref(outcomes));

  auto report = [&] {
    if (!o.progress) return;
    o.progress({shared.records_done.load(), src.size(), shared.shards_done.load(), plan.shards, shared.bytes_out.load(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
  };
  {
    std::unique_lock<std::mutex> lock(shared.mu);
    while (shared.workers_running > 0) {
      shared.changed.wait_for(lock, std::chrono::milliseconds(500));
      lock.unlock();
      report();
      lock.lock();
    }
  }
  for (auto& t : threads) t.join();
  if (shared.error) std::rethrow_exception(shared.error);
  RN_CHECK(!shared.stop.load()) << "pack stopped after " << o.stop_after_shards << " shards (test hook)";

  PackResult result;
  result.shards = plan.shards;
  result.records_per_shard = rps;
  ShardManifest manifest;
  manifest.classes = src.classes();
  manifest.labels_are_positions = src.labels_are_positions();  // a list file's, and stays so repacked
  manifest.source = comparable_source(src.name());  // absolute, for a rerun from elsewhere
  manifest.max_size = o.max_short_side;
  manifest.quality = o.quality;
  manifest.raw = o.raw;
  manifest.records_per_shard = rps;
  for (int64_t s = 0; s < plan.shards; ++s) {
    ShardOutcome& out = outcomes[static_cast<size_t>(s)];
    manifest.shards.push_back(
        {out.index.tar, shard_index_name(s), static_cast<int64_t>(out.index.records.size()), out.index.tar_bytes});
    result.records += static_cast<int64_t>(out.index.records.size());
    result.skipped += out.index.skipped;
    result.shards_reused += out.reused ? 1 : 0;
    result.bytes_in += out.bytes_in;
    result.bytes_out += out.index.tar_bytes;
    if (!out.reused) {
      result.records_packed += static_cast<int64_t>(out.index.records.size());
      result.bytes_written += out.index.tar_bytes;
    }
    for (auto& s2 : out.skipped) result.skipped_sources.push_back(std::move(s2));
  }
  if (result.records == 0) {
    // Nothing to keep: the empty shards and the marker go, and the folder if that empties it.
    for (int64_t s = 0; s < plan.shards; ++s) {
      fs::remove(plan.path(shard_tar_name(s)), ec);
      fs::remove(plan.path(shard_index_name(s)), ec);
    }
    fs::remove(fs::path(o.out_dir) / kPackMarker, ec);
    fs::remove(o.out_dir, ec);  // only when empty
    RN_FAIL() << "pack: every image of " << src.name() << " was unreadable (" << result.skipped
              << " skipped, each logged above); nothing was packed";
  }
  manifest.records = result.records;
  manifest.skipped = result.skipped;
  write_file_atomic((fs::path(o.out_dir) / kShardManifestName).string(), format_shard_manifest(manifest));
  fs::remove(fs::path(o.out_dir) / kPackMarker, ec);  // finished: dataset.json says so now
  if (result.skipped > 0) RN_LOG_WARN("pack: skipped {} unreadable images of {}", result.skipped, src.size());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report();
  return result;
}

}  // namespace rn

#include "data/idx_dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/check.h"

namespace rn {

namespace {

// A file read through zlib: gzip-compressed or plain, zlib tells them apart by the header.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) RN_FAIL() << path << ": missing file (no such file or directory)";
    if (std::filesystem::is_directory(status)) RN_FAIL() << path << ": is a directory, expected an IDX file";
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) RN_FAIL() << path << ": cannot open: " << (errno ? std::strerror(errno) : "out of memory");
    gzbuffer(file_, 1 << 18);
  }
  ~GzReader() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `n` bytes; fewer only at the end of the data. A decompression error
  // (corrupt stream) throws; a stream cut short returns what it had, and `zlib_note()`
  // then says why.
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      const int got = gzread(file_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        if (code == Z_BUF_ERROR) break;  // compressed stream ends early: a truncation, reported by the caller
        RN_FAIL() << path_ << ": read error: " << (msg ? msg : "unknown zlib error");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // " (zlib: unexpected end of file)" when the compressed stream itself was cut short.
  std::string zlib_note() {
    int code = 0;
    const char* msg = gzerror(file_, &code);
    if (code == Z_OK || msg == nullptr || *msg == '\0') return "";
    std::string text = msg;  // zlib prefixes the path, which the caller already names
    if (text.rfind(path_ + ": ", 0) == 0) text.erase(0, path_.size() + 2);
    return " (zlib: " + text + ")";
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string type_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "u8";
    case 0x09:
      return "i8";
    case 0x0B:
      return "i16";
    case 0x0C:
      return "i32";
    case 0x0D:
      return "f32";
    case 0x0E:
      return "f64";
    default:
      return "unknown type";
  }
}

}  // namespace

IdxArray idx_read_u8(const std::string& path, int rank) {
  RN_CHECK(rank >= 1 && rank <= 4) << "unsupported IDX rank " << rank;
  GzReader in(path);
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(rank);

  uint8_t header[4 + 4 * 4];
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(rank);
  const size_t got_header = in.read(header, 4);
  if (got_header == 0) RN_FAIL() << path << ": empty file, expected an IDX header";
  if (got_header < 4) {
    RN_FAIL() << path << ": truncated header: expected " << header_bytes << " bytes, got " << got_header
              << in.zlib_note();
  }
  const uint32_t magic = read_be32(header);
  if (magic != expected_magic) {
    std::ostringstream why;
    why << path << ": bad magic " << hex32(magic) << ", expected " << hex32(expected_magic) << " (u8, " << rank
        << (rank == 1 ? " dimension)" : " dimensions)");
    if ((magic >> 16) != 0) {
      why << "; not an IDX file";
    } else {
      why << "; this file holds " << type_name(static_cast<uint8_t>(magic >> 8)) << " with " << (magic & 0xff)
          << (magic == 0x00000801u   ? " dimension (a labels file?)"
              : magic == 0x00000803u ? " dimensions (an images file?)"
                                     : " dimensions");
    }
    RN_FAIL() << why.str();
  }
  const size_t got_dims = in.read(header + 4, header_bytes - 4);
  if (got_dims < header_bytes - 4) {
    RN_FAIL() << path << ": truncated header: expected " << header_bytes << " bytes, got " << 4 + got_dims
              << in.zlib_note();
  }

  IdxArray array;
  uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    const uint32_t d = read_be32(header + 4 + 4 * i);
    if (d == 0) RN_FAIL() << path << ": dimension " << i << " is 0, the file holds no data";
    total *= d;
    // 2^40 bytes is far beyond any IDX file; it guards the multiplication and the allocation.
    if (total > (uint64_t{1} << 40)) RN_FAIL() << path << ": implausible dimensions (more than 2^40 bytes)";
    array.dims.push_back(d);
  }

  // Read in chunks rather than allocating what the header promises up front, so a corrupt
  // header on a short file fails as "truncated" instead of exhausting memory.
  const char* what = rank == 1 ? "labels" : "pixels";
  const size_t expected = static_cast<size_t>(total);
  array.data.reserve(std::min<size_t>(expected, size_t{64} << 20));
  size_t have = 0;
  while (have < expected) {
    const size_t chunk = std::min<size_t>(expected - have, size_t{16} << 20);
    array.data.resize(have + chunk);
    const size_t got = in.read(array.data.data() + have, chunk);
    have += got;
    if (got < chunk) {
      RN_FAIL() << path << ": truncated: expected " << expected << " bytes of " << what << ", got " << have
                << in.zlib_note();
    }
  }

  uint8_t extra[4096];
  size_t trailing = 0;
  for (size_t got; (got = in.read(extra, sizeof extra)) > 0 && trailing < (size_t{1} << 30);) trailing += got;
  if (trailing > 0) {
    RN_FAIL() << path << ": trailing garbage: " << trailing << (trailing == 1 ? " byte" : " bytes") << " after the "
              << expected << " bytes of " << what << " that the header declares";
  }
  return array;
}

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path, const IdxOptions& options)
    : images_path_(images_path), labels_path_(labels_path), num_classes_(options.num_classes) {
  RN_CHECK(options.num_classes >= 1 && options.num_classes <= 256)
      << "num_classes " << options.num_classes << " for " << images_path << " (u8 labels allow 1..256)";
  IdxArray images = idx_read_u8(images_path, 3);
  IdxArray labels = idx_read_u8(labels_path, 1);

  const uint32_t n = images.dims[0], rows = images.dims[1], cols = images.dims[2];
  if (rows > 65536 || cols > 65536) {
    RN_FAIL() << images_path << ": implausible image size " << rows << "x" << cols;
  }
  if (labels.dims[0] != n) {
    RN_FAIL() << images_path << " has " << n << " images but " << labels_path << " has " << labels.dims[0]
              << " labels: count mismatch";
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= options.num_classes) {
      RN_FAIL() << labels_path << ": label " << int{labels.data[i]} << " at index " << i
                << " is out of range (num_classes " << options.num_classes << ")";
    }
  }
  rows_ = static_cast<int>(rows);
  cols_ = static_cast<int>(cols);

  if (options.subset.all()) {
    count_ = n;
    pixels_ = std::move(images.data);
    labels_ = std::move(labels.data);
    return;
  }
  const std::vector<int64_t> keep = subset_indices(n, options.subset, images_path);
  const size_t image_bytes = static_cast<size_t>(rows) * cols;
  count_ = static_cast<int64_t>(keep.size());
  pixels_.resize(keep.size() * image_bytes);
  labels_.resize(keep.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    const size_t src = static_cast<size_t>(keep[i]);
    std::memcpy(pixels_.data() + i * image_bytes, images.data.data() + src * image_bytes, image_bytes);
    labels_[i] = labels.data[src];
  }
}

const uint8_t* IdxDataset::image(int64_t index) const {
  RN_CHECK(index >= 0 && index < count_) << "index " << index << " outside " << name() << " (size " << count_ << ")";
  return pixels_.data() + static_cast<size_t>(index) * static_cast<size_t>(rows_) * static_cast<size_t>(cols_);
}

void IdxDataset::load(int64_t index, Sample& out) const {
  const uint8_t* src = image(index);
  uint8_t* dst = out.resize(1, rows_, cols_);
  std::memcpy(dst, src, static_cast<size_t>(rows_) * static_cast<size_t>(cols_));
  out.label = labels_[static_cast<size_t>(index)];
}

std::string_view split_name(Split split) { return split == Split::train ? "train" : "test"; }

std::string fashion_mnist_images_path(const std::string& dir, Split split) {
  return (std::filesystem::path(dir) / (split == Split::train ? "train" : "t10k")).string() + "-images-idx3-ubyte.gz";
}

std::string fashion_mnist_labels_path(const std::string& dir, Split split) {
  return (std::filesystem::path(dir) / (split == Split::train ? "train" : "t10k")).string() + "-labels-idx1-ubyte.gz";
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

bool fashion_mnist_available(const std::string& dir) {
  std::error_code ec;
  for (Split s : {Split::train, Split::test}) {
    if (!std::filesystem::is_regular_file(fashion_mnist_images_path(dir, s), ec)) return false;
    if (!std::filesystem::is_regular_file(fashion_mnist_labels_path(dir, s), ec)) return false;
  }
  return true;
}

std::shared_ptr<IdxDataset> fashion_mnist(const std::string& dir, Split split, const SubsetSpec& subset) {
  IdxOptions options;
  options.num_classes = 10;
  options.subset = subset;
  for (const std::string& path : {fashion_mnist_images_path(dir, split), fashion_mnist_labels_path(dir, split)}) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      RN_FAIL() << path << ": missing file; install Debian's dataset-fashion-mnist package or point the data "
                << "directory at a folder with train-/t10k-{images-idx3,labels-idx1}-ubyte.gz";
    }
  }
  return std::make_shared<IdxDataset>(fashion_mnist_images_path(dir, split), fashion_mnist_labels_path(dir, split),
                                      options);
}

}  // namespace rn

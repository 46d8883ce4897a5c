#include "data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/log.h"
#include "core/utf8.h"
#include "data/shard_format.h"

namespace rn {

namespace fs = std::filesystem;

void EncodedDataset::load(int64_t index, Sample& out) const {
  EncodedImage encoded;
  const int label = read(index, encoded);
  DecodedImage decoded;
  try {
    decode_image(encoded, DecodeRequest{}, decoded);
  } catch (const Error& e) {
    RN_FAIL() << source(index) << ": " << e.what();
  }
  uint8_t* dst = out.resize(3, decoded.height, decoded.width);
  std::memcpy(dst, decoded.pixels.data(), out.pixels.size());
  out.label = label;
}

bool is_image_file_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

void read_file_bytes(const std::string& path, std::vector<uint8_t>& out) {
  // Non-blocking, so that a FIFO put where a file was listed is refused, not waited on for ever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  RN_CHECK(fd >= 0) << "cannot open " << path << ": " << std::strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  RN_CHECK(::fstat(fd, &st) == 0) << "cannot stat " << path << ": " << std::strerror(errno);
  RN_CHECK(S_ISREG(st.st_mode)) << path << " is not a regular file ("
                                << (S_ISDIR(st.st_mode) ? "a folder" : "a device, pipe or socket") << ")";
  // Read to the end, whatever the size said: a file that grows or shrinks meanwhile is read as
  // it is then.
  auto read_some = [&](void* dst, size_t n) -> size_t {
    for (;;) {
      const ssize_t r = ::read(fd, dst, n);
      if (r >= 0) return static_cast<size_t>(r);
      RN_CHECK(errno == EINTR) << "cannot read " << path << ": " << std::strerror(errno);
    }
  };
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const size_t n = read_some(out.data() + got, out.size() - got);
    if (n == 0) break;
    got += n;
  }
  out.resize(got);
  uint8_t more[4096];
  while (const size_t n = read_some(more, sizeof more)) out.insert(out.end(), more, more + n);
}

namespace {

// A dataset root (train/, val/, each of class folders) given where one split was expected
// would make "train" and "val" the two classes, each with every image below it.
void check_not_split_layout(const std::string& root, const std::vector<std::string>& classes) {
  static const std::set<std::string> kSplitNames = {"train",      "training", "val",    "valid",
                                                    "validation", "test",     "testing"};
  for (const std::string& c : classes) {
    std::string lower = c;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (!kSplitNames.count(lower)) return;
    // A split holds class folders and no images of its own.
    bool subfolders = false;
    for (const auto& entry : fs::directory_iterator(fs::path(root) / c)) {
      if (entry.is_directory()) subfolders = true;
      if (entry.is_regular_file() && is_image_file_name(entry.path().filename().string())) return;
    }
    if (!subfolders) return;
  }
  std::string names, example = classes.front();
  for (const std::string& c : classes) {
    names += (names.empty() ? "" : ", ") + c + "/";
    if (c == "train") example = c;
  }
  RN_FAIL() << "image folder " << root << " holds the splits " << names
            << " (folders of class folders), not class folders: give one split, such as "
            << (fs::path(root) / example).string()
            << " (resnet train --data takes the folder above the splits and uses train/ and val/)";
}

}  // namespace

namespace {

// The image files below `dir`, following links to folders as torchvision's ImageFolder does,
// each as `prefix`/its path below `dir` as found: a link keeps its own name, not its target's.
// `open` holds the real paths of the folders being walked, so that a link back to one of them
// (a loop) is an error naming the link rather than a walk without end.
void collect_images(const fs::path& dir, const fs::path& prefix, std::vector<fs::path>& open,
                    std::vector<std::string>& files, const std::vector<std::pair<fs::path, std::string>>& class_dirs,
                    const std::string& own_class) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  RN_CHECK(!ec) << "cannot read the folder " << dir.string() << ": " << ec.message();
  // A failed increment leaves `it` at the end: the error is checked after the loop.
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    const fs::path path = it->path();
    const fs::path rel = prefix / path.filename();
    std::error_code sec;
    // The entry's type comes from the directory listing; only links are followed with a stat
    // (a dangling one is neither a folder nor a file).
    if (it->is_directory(sec)) {
      const fs::path real = fs::canonical(path, sec);
      RN_CHECK(!sec) << "cannot follow " << path.string() << ": " << sec.message();
      for (const fs::path& o : open)
        RN_CHECK(o != real) << "the link " << path.string() << " leads back to " << real.string()
                            << ", a folder it is in: the image folder would never end; remove the link";
      if (fs::is_symlink(fs::symlink_status(path, sec)))
        for (const auto& [class_dir, name] : class_dirs)
          if (name != own_class && (real == class_dir || real.native().starts_with(class_dir.native() + "/")))
            RN_LOG_WARN("the link {} leads into the class folder '{}': its images are labelled '{}' here as well",
                        path.string(), name, own_class);
      open.push_back(real);
      collect_images(path, rel, open, files, class_dirs, own_class);
      open.pop_back();
    } else if (is_image_file_name(path.filename().string()) && it->is_regular_file(sec)) {
      files.push_back(rel.generic_string());
    }
  }
  RN_CHECK(!ec) << "cannot read the folder " << dir.string() << ": " << ec.message();
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const std::string& root) : root_(root) {
  std::error_code ec;
  RN_CHECK(fs::exists(root, ec)) << "image folder " << root << " does not exist";
  RN_CHECK(fs::is_directory(root, ec)) << "image folder " << root << " is not a folder";
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  // resnet pack stopped before its dataset.json: its shards are no class folders.
  RN_CHECK(!classes_.empty() || !fs::exists(fs::path(root) / kPackMarker, ec))
      << root << " is an unfinished pack (resnet pack stopped before it wrote " << kShardManifestName
      << "): run the same resnet pack command again to finish it";
  RN_CHECK(!classes_.empty()) << "image folder " << root
                              << " has no class folders (expected root/<class>/<image files>, as torchvision's "
                                 "ImageFolder)";
  check_not_split_layout(root, classes_);
  std::vector<std::pair<fs::path, std::string>> class_dirs;
  for (const std::string& c : classes_) {
    // Class names are recorded in UTF-8 text (config.yaml, checkpoints, dataset.json), which
    // could not hold them: found here, not at the first checkpoint.
    if (const size_t at = invalid_utf8_at(c); at != std::string::npos)
      RN_FAIL() << "image folder " << root << ": the class folder name '" << c << "' is not UTF-8 (byte "
                << fmt::format("0x{:02x}", static_cast<unsigned char>(c[at])) << " at " << at
                << "); rename it: class names are recorded in UTF-8 text (config.yaml, checkpoints)";
    // torchvision's ImageFolder makes a class of a hidden folder too; it shifts every label
    // after it, which is seldom what was meant.
    if (c.starts_with("."))
      RN_LOG_WARN(
          "image folder {}: the hidden folder '{}' is a class (as in torchvision's ImageFolder), which moves the "
          "labels of the classes after it; remove it unless it is one",
          root, c);
    const fs::path real = fs::canonical(fs::path(root) / c, ec);
    if (ec) continue;
    // A class folder that is (a link to) another class folder, or lies inside one: its images
    // are labelled twice.
    for (const auto& [other_real, other] : class_dirs) {
      const auto [a, b] = std::mismatch(other_real.begin(), other_real.end(), real.begin(), real.end());
      if (a == other_real.end() || b == real.end())
        RN_LOG_WARN(
            "image folder {}: the class folders '{}' and '{}' lead to the same images ({}): they are "
            "labelled as both classes",
            root, other, c, (a == other_real.end() ? real : other_real).string());
    }
    class_dirs.emplace_back(real, c);
  }
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> files;
    const fs::path dir = fs::path(root) / classes_[c];
    std::vector<fs::path> open = {fs::canonical(root, ec)};
    const fs::path real = fs::canonical(dir, ec);
    if (!ec) open.push_back(real);
    collect_images(dir, fs::path(classes_[c]), open, files, class_dirs, classes_[c]);
    // A packed split (resnet pack's output) beside others: the root holds packed splits.
    RN_CHECK(!files.empty() || !fs::exists(dir / std::string(kShardManifestName), ec))
        << "image folder " << root << " holds packed folders (" << dir.string() << " has " << kShardManifestName
        << ", written by resnet pack), not class folders: give one of them, such as " << dir.string();
    RN_CHECK(!files.empty()) << "class folder " << dir.string()
                             << " has no image files (.jpg, .jpeg or .png in any case); remove it or add images";
    std::sort(files.begin(), files.end());
    for (std::string& f : files) {
      files_.push_back(std::move(f));
      labels_.push_back(static_cast<int>(c));
    }
  }
}

int ImageFolderDataset::read(int64_t index, EncodedImage& out) const {
  RN_CHECK(index >= 0 && index < size()) << "index " << index << " outside " << name() << " (size " << size() << ")";
  read_file_bytes(source(index), out.storage);
  out.use_storage();
  out.codec = ImageCodec::unknown;
  return labels_[static_cast<size_t>(index)];
}

std::string ImageFolderDataset::source(int64_t index) const {
  return (fs::path(root_) / files_[static_cast<size_t>(index)]).string();
}

ImageListDataset::ImageListDataset(const std::string& root, const std::string& list_file,
                                   std::vector<std::string> classes)
    : list_file_(list_file) {
  root_ = root;
  std::error_code ec;
  RN_CHECK(fs::is_directory(root, ec)) << "image root " << root << " (for list " << list_file << ") is not a folder";
  std::ifstream in(list_file);
  RN_CHECK(in.good()) << "cannot open list file " << list_file;
  std::string line;
  int max_label = -1;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    // The label is the last field, so that paths may contain spaces.
    const size_t last_space = line.find_last_of(" \t");
    RN_CHECK(last_space != std::string::npos && last_space > first)
        << list_file << ":" << line_no << ": expected 'relative/path label', got '" << line << "'";
    std::string path = line.substr(first, line.find_last_not_of(" \t", last_space) - first + 1);
    const std::string label_text = line.substr(last_space + 1);
    int label = -1;
    try {
      size_t used = 0;
      label = std::stoi(label_text, &used);
      RN_CHECK(used == label_text.size()) << "";
    } catch (...) {
      RN_FAIL() << list_file << ":" << line_no << ": label '" << label_text << "' is not an integer";
    }
    RN_CHECK(label >= 0) << list_file << ":" << line_no << ": negative label " << label;
    RN_CHECK(classes.empty() || label < static_cast<int>(classes.size()))
        << list_file << ":" << line_no << ": label " << label << " but only " << classes.size() << " classes";
    RN_CHECK(fs::is_regular_file(fs::path(root) / path, ec))
        << list_file << ":" << line_no << ": " << (fs::path(root) / path).string() << " does not exist";
    files_.push_back(std::move(path));
    labels_.push_back(label);
    max_label = std::max(max_label, label);
  }
  RN_CHECK(!files_.empty()) << "list file " << list_file << " names no images";
  if (classes.empty()) {
    for (int i = 0; i <= max_label; ++i) classes.push_back(std::to_string(i));
  }
  classes_ = std::move(classes);
}

}  // namespace rn

// Image files on disk, as torchvision's ImageFolder lays them out (root/<class>/<file>,
// labels by sorted class name) or as a list file ("relative/path label" per line, for
// validation sets kept flat, like ImageNet's val/). Files are found by extension, case-
// insensitively (.jpg .jpeg .png .JPEG ...); their codec is sniffed from the bytes when
// decoded. The tree is scanned once at construction, sorted, so indices are stable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/encoded_dataset.h"

namespace rn {

// True for names ending in .jpg, .jpeg, .png in any case.
bool is_image_file_name(const std::string& name);

class ImageFolderDataset : public EncodedDataset {
 public:
  // Throws rn::Error when `root` is missing or not a folder, has no class folders, or a
  // class folder has no images (naming it).
  explicit ImageFolderDataset(const std::string& root);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  const std::vector<std::string>& classes() const override { return classes_; }
  int read(int64_t index, EncodedImage& out) const override;
  std::string source(int64_t index) const override;
  std::string name() const override { return "imagefolder:" + root_; }

  const std::string& root() const { return root_; }
  // The path relative to root ("n01440764/n01440764_10026.JPEG") and label of sample `index`.
  const std::string& relative_path(int64_t index) const { return files_[static_cast<size_t>(index)]; }
  int label(int64_t index) const { return labels_[static_cast<size_t>(index)]; }

 protected:
  ImageFolderDataset() = default;
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;  // relative to root_
  std::vector<int> labels_;
};

// "relative/path label" per line (blank lines and lines starting with # ignored); paths are
// relative to `root`. Class names come from `classes` when given (one per label), else
// they are the label numbers. Every listed file must exist; errors name the list file and
// line.
class ImageListDataset : public ImageFolderDataset {
 public:
  ImageListDataset(const std::string& root, const std::string& list_file, std::vector<std::string> classes = {});
  std::string name() const override { return "imagelist:" + list_file_; }
  bool labels_are_positions() const override { return true; }

 private:
  std::string list_file_;
};

// Reads a whole file into `out` (reusing its capacity). Throws rn::Error naming the path.
void read_file_bytes(const std::string& path, std::vector<uint8_t>& out);

}  // namespace rn

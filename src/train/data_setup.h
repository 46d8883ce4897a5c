// The datasets and loaders a Config describes, for training, evaluation and benchmarks:
// Fashion-MNIST IDX files, synthetic images, or image folders (class folders of JPEG/PNG,
// a list file, or packed shards) with RandomResizedCrop for training and resize + centre
// crop for evaluation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "data/encoded_dataset.h"
#include "data/loader.h"
#include "prof/trace.h"
#include "train/config.h"

namespace rn {

// Opens an image dataset at `path`: a folder packed by `resnet pack` (it holds
// dataset.json), a folder of class folders, or, with `list_file`, the files it lists under
// `path`.
std::shared_ptr<const EncodedDataset> open_image_dataset(const std::string& path, const std::string& list_file = "");

// The training and validation folders of an imagefolder config: root/train and root/val
// (or root/validation, root/valid) when root has a train/ folder; else root itself for training, and data.val_root (or
// the training folder, with a warning) for validation.
struct ImageFolderPaths {
  std::string train, val;
  bool val_is_train = false;
};
ImageFolderPaths image_folder_paths(const DataConfig& data);

struct Loaders {
  std::unique_ptr<DataLoader> train;
  std::unique_ptr<DataLoader> val;
  // Image folders: the class names, label = position (data.classes, or the training folder's
  // class folders when that is empty); empty for the other datasets.
  std::vector<std::string> classes;
};

// Loaders for training (shuffled, augmented, drop_last as configured) and validation (in
// order, every sample). Batches come in `dtype` and `layout`. Checks that the data fit the
// model (channels, size, classes). Image folders label class folders by name with
// data.classes (the training folder's classes when empty): a validation folder that lacks a
// class still labels the others as training did, and one with a class training never had is
// an error naming it.
// `shard`: this rank's part of a data-parallel job (training: dealt out, see data/sampler.h;
// validation: a contiguous slice, every sample on exactly one rank).
// `wrap_train` and `wrap_val` (tests) may replace the small-image training and validation
// datasets (Fashion-MNIST, synthetic) by wrappers around them, e.g. one that loads slowly.
// u8 batches (a device backend, train/batch_feeder.h) leave crops, flips and normalisation
// to the device (DataLoaderOptions::defer_crop_flip). `batch_memory`: where the loaders'
// batch buffers live (a device backend's pinned memory; nullptr: plain host memory).
using DatasetWrapper = std::function<std::shared_ptr<const Dataset>(std::shared_ptr<const Dataset>)>;
Loaders make_loaders(const Config& cfg, DType dtype, Layout layout, std::shared_ptr<TraceRecorder> trace = nullptr,
                     ShardSpec shard = {}, const DatasetWrapper& wrap_train = {}, MemorySpace* batch_memory = nullptr,
                     const DatasetWrapper& wrap_val = {});
// The validation loader alone (resnet eval).
std::unique_ptr<DataLoader> make_val_loader(const Config& cfg, DType dtype, Layout layout,
                                            MemorySpace* batch_memory = nullptr);

// Loader options common to both.
DataLoaderOptions loader_options(const Config& cfg, DType dtype, Layout layout, MemorySpace* batch_memory = nullptr);

}  // namespace rn

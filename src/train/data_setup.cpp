#include "train/data_setup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "core/log.h"
#include "core/plural.h"
#include "data/augment.h"
#include "data/idx_dataset.h"
#include "data/image_folder.h"
#include "data/shard_dataset.h"
#include "data/synthetic_dataset.h"
#include "data/transform.h"

namespace rn {

namespace fs = std::filesystem;

namespace {

// The part of a dataset that config key `setting` (N > 0: N samples; 0: all) asks for.
SubsetSpec subset_of(int64_t n, const char* setting) {
  SubsetSpec s;
  if (n > 0) s.count = n;
  s.setting = setting;
  return s;
}

std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

void check_fits(const Config& cfg, const Dataset& set) {
  RN_CHECK(set.num_classes() <= cfg.model.num_classes) << "dataset " << set.name() << " has " << set.num_classes()
                                                       << " classes but model.num_classes is " << cfg.model.num_classes;
}

void check_fixed_geometry(const Config& cfg, const Dataset& set) {
  const SampleGeometry g = set.geometry();
  RN_CHECK(g.channels == cfg.model.in_channels && g.height == cfg.model.image_size[0] &&
           g.width == cfg.model.image_size[1])
      << "dataset " << set.name() << " gives " << g.str() << " images but the model expects " << cfg.model.in_channels
      << "x" << cfg.model.image_size[0] << "x" << cfg.model.image_size[1] << " (model.in_channels, model.image_size)";
}

// A subset of an encoded dataset that is still an encoded dataset.
class EncodedSubset : public EncodedDataset {
 public:
  EncodedSubset(std::shared_ptr<const EncodedDataset> base, const SubsetSpec& spec)
      : base_(std::move(base)), indices_(subset_indices(base_->size(), spec, base_->name())) {}
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  const std::vector<std::string>& classes() const override { return base_->classes(); }
  int read(int64_t index, EncodedImage& out) const override { return base_->read(base(index), out); }
  std::string source(int64_t index) const override { return base_->source(base(index)); }
  std::string name() const override { return "subset(" + std::to_string(size()) + " of " + base_->name() + ")"; }

 private:
  int64_t base(int64_t index) const {
    RN_CHECK(index >= 0 && index < size()) << "index " << index << " outside " << name();
    return indices_[static_cast<size_t>(index)];
  }
  std::shared_ptr<const EncodedDataset> base_;
  std::vector<int64_t> indices_;
};

// N samples drawn at random with `seed` (fixed for a run): image folders list their files class by
// class, so the first N would hold one class or a few.
std::shared_ptr<const EncodedDataset> subset(std::shared_ptr<const EncodedDataset> ds, int64_t n, int64_t seed,
                                             const char* setting) {
  if (n <= 0) return ds;
  SubsetSpec spec = subset_of(n, setting);
  spec.random = true;
  spec.seed = static_cast<uint64_t>(seed);
  return std::make_shared<EncodedSubset>(std::move(ds), spec);
}

// A dataset whose class folders get the labels of `classes` by name.
class RelabelledDataset : public EncodedDataset {
 public:
  RelabelledDataset(std::shared_ptr<const EncodedDataset> base, std::vector<std::string> classes,
                    std::vector<int> label_of)
      : base_(std::move(base)), classes_(std::move(classes)), label_of_(std::move(label_of)) {}
  int64_t size() const override { return base_->size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  int read(int64_t index, EncodedImage& out) const override {
    const int label = base_->read(index, out);
    RN_CHECK(label >= 0 && static_cast<size_t>(label) < label_of_.size())
        << base_->source(index) << ": label " << label << " outside the " << label_of_.size() << " classes of "
        << base_->name();
    return label_of_[static_cast<size_t>(label)];
  }
  std::string source(int64_t index) const override { return base_->source(index); }
  std::string name() const override { return base_->name(); }

 private:
  std::shared_ptr<const EncodedDataset> base_;
  std::vector<std::string> classes_;
  std::vector<int> label_of_;
};

// `ds` labelled by `classes` (data.classes): class folders (and packed shards) by their names; a
// list file's labels (and a pack of one's) are positions already. `what` names the data in errors.
std::shared_ptr<const EncodedDataset> labelled_by(std::shared_ptr<const EncodedDataset> ds,
                                                  const std::vector<std::string>& classes, const std::string& what) {
  if (classes.empty() || ds->classes() == classes) return ds;
  if (ds->labels_are_positions()) {
    RN_CHECK(ds->classes().size() <= classes.size())
        << what << " " << ds->name() << " has labels up to " << ds->classes().size() - 1 << " but data.classes names "
        << classes.size() << " classes";
    return ds;
  }
  std::vector<int> label_of;
  for (const std::string& c : ds->classes()) {
    const auto it = std::find(classes.begin(), classes.end(), c);
    if (it == classes.end()) {
      std::string known;
      for (size_t i = 0; i < classes.size() && i < 8; ++i) known += (i ? ", " : "") + classes[i];
      RN_FAIL() << what << " " << ds->name() << " has class '" << c << "', which is not one of the " << classes.size()
                << " classes the model was trained on (data.classes: " << known << (classes.size() > 8 ? ", ..." : "")
                << ")";
    }
    label_of.push_back(static_cast<int>(it - classes.begin()));
  }
  return std::make_shared<RelabelledDataset>(std::move(ds), classes, std::move(label_of));
}

std::shared_ptr<RandomResizedCrop> train_augment(const Config& cfg) {
  RandomResizedCropOptions o;
  o.height = static_cast<int>(cfg.model.image_size[0]);
  o.width = static_cast<int>(cfg.model.image_size[1]);
  o.scale = {cfg.data.augment.scale[0], cfg.data.augment.scale[1]};
  o.ratio = {cfg.data.augment.ratio[0], cfg.data.augment.ratio[1]};
  o.flip_prob = cfg.data.augment.flip ? 0.5f : 0.0f;
  auto a = std::make_shared<RandomResizedCrop>(o);
  a->dct_scaling = cfg.data.augment.dct_scaling;
  return a;
}

std::shared_ptr<ResizeCenterCrop> eval_augment(const Config& cfg) {
  ResizeCenterCropOptions o;
  o.resize = static_cast<int>(cfg.data.augment.eval_resize);
  o.height = static_cast<int>(cfg.model.image_size[0]);
  o.width = static_cast<int>(cfg.model.image_size[1]);
  auto a = std::make_shared<ResizeCenterCrop>(o);
  a->dct_scaling = cfg.data.augment.dct_scaling;
  return a;
}

DataLoaderOptions val_options(DataLoaderOptions o) {
  o.name = "val loader";
  o.shuffle = false;
  o.drop_last = false;
  o.shard.equal = false;
  // Validation and `resnet eval` score the images as they are: a cached copy is downscaled to
  // data.cache_short_side first, which would make the figures depend on the cache.
  o.cache_bytes = 0;
  return o;
}

}  // namespace

std::shared_ptr<const EncodedDataset> open_image_dataset(const std::string& path, const std::string& list_file) {
  // A folder written by `resnet pack` (docs/shards.md).
  if (list_file.empty() && fs::exists(fs::path(path) / kShardManifestName)) return std::make_shared<ShardDataset>(path);
  if (!list_file.empty()) return std::make_shared<ImageListDataset>(path, list_file);
  return std::make_shared<ImageFolderDataset>(path);
}

ImageFolderPaths image_folder_paths(const DataConfig& data) {
  ImageFolderPaths p;
  std::error_code ec;
  RN_CHECK(fs::is_directory(data.root, ec)) << "data.root '" << data.root << "' is not a folder";
  // The validation split under its usual names; test/ is a test set, used only when named.
  const auto val_under = [&](const fs::path& root) -> std::string {
    for (const char* name : {"val", "validation", "valid"})
      if (fs::is_directory(root / name, ec)) return (root / name).string();
    return {};
  };
  if (fs::is_directory(fs::path(data.root) / "train", ec)) {
    p.train = (fs::path(data.root) / "train").string();
    p.val = val_under(data.root);
  } else {
    p.train = data.root;
    // A root of splits without train/ (val/, perhaps test/: a test set kept in the dataset's
    // layout): evaluation reads val/; training from it stops on the image folder's split error.
    // A class that happens to be called "val" beside other classes stays a class.
    const std::string val = val_under(data.root);
    bool only_splits = !val.empty();
    for (fs::directory_iterator it(data.root, ec), end; only_splits && !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_directory(ec) && name != "val" && name != "validation" && name != "valid" && name != "test")
        only_splits = false;
    }
    if (only_splits && !ec) p.val = val;
  }
  if (!data.val_root.empty()) p.val = data.val_root;
  if (p.val.empty() || !fs::exists(p.val, ec)) {
    RN_CHECK(data.val_root.empty()) << "data.val_root '" << data.val_root << "' does not exist";
    p.val = p.train;
    p.val_is_train = true;
  }
  return p;
}

DataLoaderOptions loader_options(const Config& cfg, DType dtype, Layout layout, MemorySpace* batch_memory) {
  DataLoaderOptions lo;
  lo.name = "train loader";
  lo.defer_crop_flip = dtype == DType::u8;
  lo.batch_memory = batch_memory;
  lo.batch_size = cfg.data.batch_size;
  lo.workers = static_cast<int>(cfg.data.workers);
  lo.prefetch = static_cast<int>(std::max<int64_t>(cfg.data.prefetch, 1));
  lo.drop_last = cfg.data.drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.dtype = dtype;
  lo.layout = layout;
  lo.mean = to_floats(cfg.data.mean);
  lo.std = to_floats(cfg.data.std);
  lo.bad_files = cfg.data.bad_files;
  lo.cache_bytes = static_cast<size_t>(cfg.data.cache_mb) << 20;
  lo.cache_short_side = static_cast<int>(cfg.data.cache_short_side);
  return lo;
}

Loaders make_loaders(const Config& cfg, DType dtype, Layout layout, std::shared_ptr<TraceRecorder> trace,
                     ShardSpec shard, const DatasetWrapper& wrap_train, MemorySpace* batch_memory,
                     const DatasetWrapper& wrap_val) {
  const DataConfig& d = cfg.data;
  DataLoaderOptions lo = loader_options(cfg, dtype, layout, batch_memory);
  lo.trace = std::move(trace);
  lo.shard = shard;
  lo.shard.equal = true;
  Loaders loaders;
  switch (d.dataset) {
    case DatasetKind::fashion_mnist:
    case DatasetKind::synthetic: {
      std::shared_ptr<const Dataset> train, val;
      if (d.dataset == DatasetKind::fashion_mnist) {
        train = fashion_mnist(d.root, Split::train, subset_of(d.train_subset, "data.train_subset"));
        val = fashion_mnist(d.root, Split::test, subset_of(d.val_subset, "data.val_subset"));
      } else {
        SyntheticOptions o;
        o.channels = static_cast<int>(cfg.model.in_channels);
        o.height = static_cast<int>(cfg.model.image_size[0]);
        o.width = static_cast<int>(cfg.model.image_size[1]);
        o.num_classes = static_cast<int>(cfg.model.num_classes);
        o.size = d.train_subset > 0 ? d.train_subset : 10000;
        o.seed = static_cast<uint64_t>(cfg.run.seed);
        train = std::make_shared<SyntheticDataset>(o);
        o.size = d.val_subset > 0 ? d.val_subset : 2000;
        o.seed = static_cast<uint64_t>(cfg.run.seed) + 1;
        val = std::make_shared<SyntheticDataset>(o);
      }
      for (const Dataset* set : {train.get(), val.get()}) {
        check_fits(cfg, *set);
        check_fixed_geometry(cfg, *set);
      }
      if (wrap_train) train = wrap_train(std::move(train));
      if (wrap_val) val = wrap_val(std::move(val));
      CropFlipNormalizeOptions to;
      to.pad = static_cast<int>(d.augment.random_crop_padding);
      to.flip_prob = d.augment.flip ? 0.5f : 0.0f;
      to.mean = lo.mean;
      to.std = lo.std;
      loaders.train = std::make_unique<DataLoader>(train, std::make_shared<CropFlipNormalize>(to), lo);
      loaders.val = std::make_unique<DataLoader>(val, small_image_eval_transform(to.mean, to.std), val_options(lo));
      break;
    }
    case DatasetKind::imagefolder: {
      const ImageFolderPaths paths = image_folder_paths(d);
      // Labels by class name: data.classes, or the training folder's (which the trainer records).
      std::shared_ptr<const EncodedDataset> train = open_image_dataset(paths.train);
      // A pack whose images were downscaled below the model's input: every crop is upsampled.
      if (const auto* packed = dynamic_cast<const ShardDataset*>(train.get());
          packed && packed->manifest().max_size > 0 &&
          packed->manifest().max_size < std::max(cfg.model.image_size[0], cfg.model.image_size[1]))
        RN_LOG_WARN(
            "{} was packed with --max-size {}, below the model's input of {}x{}: every image is upsampled to fill a "
            "crop (pack it again with a larger --max-size, or none)",
            paths.train, packed->manifest().max_size, cfg.model.image_size[0], cfg.model.image_size[1]);
      loaders.classes = d.classes.empty() ? train->classes() : d.classes;
      if (!d.classes.empty()) {
        // A listed class may lack a folder (docs/images.md); said, as a model.num_classes above
        // the folder's count is below.
        const std::vector<std::string> have = train->classes();
        std::vector<std::string> missing;
        for (const std::string& c : d.classes)
          if (std::find(have.begin(), have.end(), c) == have.end()) missing.push_back(c);
        if (!missing.empty())
          RN_LOG_WARN(
              "data.classes lists {} that {} has no images of ({}{}): those outputs are never a right answer "
              "in training",
              counted(static_cast<int64_t>(missing.size()), "class", "classes"), paths.train,
              fmt::format("{}",
                          fmt::join(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 5), ", ")),
              missing.size() > 5 ? ", ..." : "");
      }
      train = subset(labelled_by(std::move(train), loaders.classes, "training data"), d.train_subset, cfg.run.seed,
                     "data.train_subset");
      if (paths.val_is_train) {
        std::error_code ec;
        const fs::path test = fs::path(d.root) / "test";
        RN_LOG_WARN(
            "no validation folder ({} has no val/, validation/ or valid/ and data.val_root is empty): evaluating on "
            "the training images{}",
            d.root,
            paths.train != d.root && fs::is_directory(test, ec)
                ? fmt::format(" (to evaluate on its test set: data.val_root={})", test.string())
                : std::string());
      }
      const bool val_list = !paths.val_is_train && !d.val_list.empty();
      auto val = subset(labelled_by(open_image_dataset(paths.val, val_list ? d.val_list : ""), loaders.classes,
                                    "the validation data"),
                        d.val_subset, cfg.run.seed + 1, "data.val_subset");
      check_fits(cfg, *train);
      check_fits(cfg, *val);
      if (train->num_classes() < cfg.model.num_classes)
        RN_LOG_WARN(
            "model.num_classes is {} but the training data has {} classes: {} of the model's outputs are never "
            "a right answer (set model.num_classes={} unless you mean to add classes later)",
            cfg.model.num_classes, train->num_classes(), cfg.model.num_classes - train->num_classes(),
            train->num_classes());
      RN_LOG_INFO("data: {} ({} images, {} classes), validation {} ({} images)", train->name(), train->size(),
                  train->num_classes(), val->name(), val->size());
      const int64_t input_side = std::max(cfg.model.image_size[0], cfg.model.image_size[1]);
      if (d.cache_mb > 0 && d.cache_short_side < input_side)
        RN_LOG_WARN(
            "data.cache_short_side {} is below the model's input of {}x{}: cached training images are smaller than a "
            "crop and get upsampled (set data.cache_short_side={} or more)",
            d.cache_short_side, cfg.model.image_size[0], cfg.model.image_size[1], input_side);
      loaders.train = std::make_unique<DataLoader>(train, train_augment(cfg), lo);
      DataLoaderOptions vo = val_options(lo);
      vo.trace = nullptr;
      loaders.val = std::make_unique<DataLoader>(val, eval_augment(cfg), vo);
      break;
    }
  }
  return loaders;
}

std::unique_ptr<DataLoader> make_val_loader(const Config& cfg, DType dtype, Layout layout,
                                            MemorySpace* batch_memory) {
  const DataConfig& d = cfg.data;
  const DataLoaderOptions vo = val_options(loader_options(cfg, dtype, layout, batch_memory));
  switch (d.dataset) {
    case DatasetKind::fashion_mnist: {
      auto val = fashion_mnist(d.root, Split::test, subset_of(d.val_subset, "data.val_subset"));
      check_fits(cfg, *val);
      return std::make_unique<DataLoader>(val, small_image_eval_transform(vo.mean, vo.std), vo);
    }
    case DatasetKind::synthetic:
      break;
    case DatasetKind::imagefolder: {
      const ImageFolderPaths paths = image_folder_paths(d);
      const bool val_list = !paths.val_is_train && !d.val_list.empty();
      auto val = open_image_dataset(paths.val, val_list ? d.val_list : "");
      if (d.classes.empty() && !val_list && val->num_classes() != cfg.model.num_classes)
        RN_LOG_WARN(
            "the model's class names are not recorded (weights imported or from an older run: data.classes is "
            "empty), so the {} class folders of {} are labelled 0..{} in sorted order, while the model has {} "
            "outputs; set data.classes to the names in the model's order if that is not right",
            val->num_classes(), val->name(), val->num_classes() - 1, cfg.model.num_classes);
      val = subset(labelled_by(std::move(val), d.classes, "the evaluation data"), d.val_subset, cfg.run.seed + 1,
                   "data.val_subset");
      check_fits(cfg, *val);
      return std::make_unique<DataLoader>(val, eval_augment(cfg), vo);
    }
  }
  RN_FAIL() << "resnet eval needs a real dataset (data.dataset=fashion_mnist or imagefolder), not synthetic";
}

}  // namespace rn

// Training reads a folder packed by `resnet pack` wherever it reads an image folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/image_folder.h"
#include "data/image_folder_files.h"
#include "data/loader.h"
#include "data/shard_dataset.h"
#include "data/shard_pack.h"
#include "train/data_setup.h"
#include "train/log_capture.h"
#include "train/test_dir.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

// An image-folder config of 16x16 RGB images with `classes` classes read from `root`.
Config folder_config(const std::string& root, int64_t classes, int64_t batch) {
  Config cfg;
  cfg.model.num_classes = classes;
  cfg.model.in_channels = 3;
  cfg.model.image_size = {16, 16};
  cfg.data.dataset = DatasetKind::imagefolder;
  cfg.data.root = root;
  cfg.data.mean = {0.5, 0.5, 0.5};
  cfg.data.std = {0.25, 0.25, 0.25};
  cfg.data.augment.eval_resize = 16;
  cfg.data.batch_size = batch;
  cfg.data.workers = 0;
  return cfg;
}

TEST(DataSetupShards, APackedFolderOpensAsShards) {
  TestDir dir;
  test::write_image_folder(dir.path() / "src", 2, 3);
  const ImageFolderDataset src(dir.file("src"));
  PackOptions o;
  o.out_dir = dir.file("packed");
  o.records_per_shard = 4;
  o.workers = 1;
  pack_shards(src, o);

  const auto packed = open_image_dataset(dir.file("packed"));
  EXPECT_EQ(packed->name(), "shards:" + dir.file("packed"));
  EXPECT_EQ(packed->size(), 6);
  EXPECT_EQ(packed->classes(), src.classes());
  EXPECT_EQ(open_image_dataset(dir.file("src"))->name(), src.name()) << "a plain folder is still an ImageFolder";
}

// A list file's labels are positions in the model's classes; packed, they stay positions,
// so that the model evaluates the pack as it evaluates the list.
TEST(DataSetupShards, APackOfAListFileIsLabelledByPosition) {
  TestDir dir;
  const auto files = test::write_image_folder(dir.path() / "src", 3, 2);
  {
    std::ofstream list(dir.file("list.txt"));
    for (size_t i = 0; i < files.size(); ++i)
      list << fs::relative(files[i], dir.path() / "src").generic_string() << " " << i / 2 << "\n";
  }
  const ImageListDataset src(dir.file("src"), dir.file("list.txt"));
  PackOptions o;
  o.out_dir = dir.file("packed");
  o.workers = 1;
  pack_shards(src, o);

  Config cfg = folder_config(dir.file("src"), 3, 6);
  cfg.data.val_root = dir.file("packed");
  cfg.data.classes = {"a", "b", "c"};  // the names of a model trained on class folders
  cfg.validate();
  const auto loader = make_val_loader(cfg, DType::f32, Layout::nhwc);
  EXPECT_EQ(loader->dataset().num_classes(), 3);
  loader->start_epoch(0);
  const Batch* b = loader->next();
  ASSERT_NE(b, nullptr);
  for (int64_t n = 0; n < b->size; ++n)
    EXPECT_EQ(b->label_data()[n], static_cast<int32_t>(b->sample_indices[static_cast<size_t>(n)] / 2));
  // Repacked, the pack keeps its positions.
  o.out_dir = dir.file("again");
  pack_shards(ShardDataset(dir.file("packed")), o);
  EXPECT_TRUE(ShardDataset(dir.file("again")).manifest().labels_are_positions);
}

// Training on a pack downscaled below the model's input is said: every crop is upsampled.
TEST(DataSetupShards, APackSmallerThanTheInputIsSaid) {
  TestDir dir;
  test::write_image_folder(dir.path() / "src", 2, 3);
  PackOptions o;
  o.out_dir = dir.file("packed");
  o.workers = 1;
  o.max_short_side = 8;
  pack_shards(ImageFolderDataset(dir.file("src")), o);
  Config cfg = folder_config(dir.file("packed"), 2, 2);
  cfg.validate();
  LogCapture log;
  make_loaders(cfg, DType::f32, Layout::nhwc);
  EXPECT_NE(log.text().find("was packed with --max-size 8, below the model's input of 16x16"), std::string::npos)
      << log.text();
}

}  // namespace
}  // namespace rn

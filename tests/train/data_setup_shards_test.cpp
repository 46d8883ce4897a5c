// Training reads a folder packed by `resnet pack` wherever it reads an image folder.
#include <gtest/gtest.h>

#include "data/image_folder.h"
#include "data/image_folder_files.h"
#include "data/shard_pack.h"
#include "train/data_setup.h"
#include "train/test_dir.h"

namespace rn {
namespace {

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

}  // namespace
}  // namespace rn

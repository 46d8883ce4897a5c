// ImageFolder and list-file datasets, and the loader's encoded-image path: sharding and
// shuffling, determinism, bad-file policies, the decoded-image cache, stage timings.
#include "data/image_folder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "../train/log_capture.h"
#include "../train/test_dir.h"
#include "core/check.h"
#include "data/augment.h"
#include "data/image_cache.h"
#include "data/image_codec.h"
#include "data/loader.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A smooth w x h RGB image that differs per seed.
std::vector<uint8_t> jpeg_image(int w, int h, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>((x * (c + 1) + y * 2 + seed * 37) % 256);
  std::vector<uint8_t> jpeg;
  encode_jpeg(rgb.data(), w, h, 90, jpeg);
  return jpeg;
}

// root/<class>/<n>.jpg for `classes` classes of `per_class` images of varied sizes.
void make_folder(const fs::path& root, int classes, int per_class) {
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      const int seed = c * 100 + i;
      write_bytes(
          root / ("class_" + std::to_string(c)) / ("img_" + std::to_string(i) + (i % 3 == 0 ? ".JPEG" : ".jpg")),
          jpeg_image(40 + (seed * 7) % 50, 30 + (seed * 5) % 40, seed));
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

DataLoaderOptions options(int64_t batch, int workers) {
  DataLoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = 2;
  o.seed = 7;
  o.dtype = DType::u8;
  o.layout = Layout::nhwc;
  return o;
}

std::shared_ptr<RandomResizedCrop> train_augment(int size) {
  RandomResizedCropOptions o;
  o.height = o.width = size;
  return std::make_shared<RandomResizedCrop>(o);
}

// Every batch of one epoch: pixels, labels and sample indices.
struct EpochData {
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;
  std::vector<int64_t> replaced;  // the sample indices the batches mark as stood in for
};

EpochData run_epoch(DataLoader& loader, int64_t epoch) {
  EpochData d;
  loader.start_epoch(epoch);
  while (const Batch* b = loader.next()) {
    const auto* p = static_cast<const uint8_t*>(b->images.data);
    d.pixels.insert(d.pixels.end(), p, p + b->images.numel());
    d.labels.insert(d.labels.end(), b->label_data(), b->label_data() + b->size);
    d.indices.insert(d.indices.end(), b->sample_indices.begin(), b->sample_indices.end());
    EXPECT_EQ(b->replaced.size(), static_cast<size_t>(b->size));
    for (size_t i = 0; i < b->replaced.size(); ++i)
      if (b->replaced[i]) d.replaced.push_back(b->sample_indices[i]);
  }
  return d;
}

TEST(ImageFolder, ClassesSortedFilesByExtensionAnyCase) {
  TestDir dir;
  make_folder(dir.path() / "root", 3, 4);
  write_bytes(dir.path() / "root" / "class_1" / "notes.txt", {'h', 'i'});
  write_bytes(dir.path() / "root" / "class_2" / "deep" / "x.PNG", jpeg_image(20, 20, 1));  // nested, any case
  ImageFolderDataset ds((dir.path() / "root").string());
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"class_0", "class_1", "class_2"}));
  EXPECT_EQ(ds.size(), 13);
  EXPECT_EQ(ds.num_classes(), 3);
  for (int64_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(ds.relative_path(i).substr(0, 7), ds.classes()[static_cast<size_t>(ds.label(i))]);
  }
  EXPECT_TRUE(is_image_file_name("a.JpEg"));
  EXPECT_FALSE(is_image_file_name("a.gif"));
  Sample s;
  ds.load(0, s);
  EXPECT_EQ(s.channels, 3);
  EXPECT_GT(s.width, 0);
}

TEST(ImageFolder, MissingFolderAndEmptyClassAreClearErrors) {
  TestDir dir;
  EXPECT_NE(error_of([&] { ImageFolderDataset((dir.path() / "nope").string()); }).find("does not exist"),
            std::string::npos);
  fs::create_directories(dir.path() / "empty_root");
  EXPECT_NE(error_of([&] { ImageFolderDataset((dir.path() / "empty_root").string()); }).find("no class folders"),
            std::string::npos);
  make_folder(dir.path() / "root", 2, 2);
  fs::create_directories(dir.path() / "root" / "class_9");
  const std::string e = error_of([&] { ImageFolderDataset((dir.path() / "root").string()); });
  EXPECT_NE(e.find("class_9"), std::string::npos) << e;
  EXPECT_NE(e.find("no image files"), std::string::npos) << e;
}

// A dataset root of splits, given where one split belongs, would make "train" and "val" the
// classes; it is refused, naming a split to give instead.
TEST(ImageFolder, ARootOfSplitsIsNotAnImageFolder) {
  TestDir dir;
  make_folder(dir.path() / "data" / "train", 2, 2);
  make_folder(dir.path() / "data" / "val", 2, 1);
  const std::string e = error_of([&] { ImageFolderDataset((dir.path() / "data").string()); });
  EXPECT_NE(e.find("holds the splits train/, val/"), std::string::npos) << e;
  EXPECT_NE(e.find((dir.path() / "data" / "train").string()), std::string::npos) << e;
  EXPECT_EQ(ImageFolderDataset((dir.path() / "data" / "train").string()).num_classes(), 2);
  // Classes that happen to carry such a name, with images of their own, stay classes.
  make_folder(dir.path() / "named", 1, 1);
  fs::rename(dir.path() / "named" / "class_0", dir.path() / "named" / "test");
  EXPECT_EQ(ImageFolderDataset((dir.path() / "named").string()).classes(), (std::vector<std::string>{"test"}));
}

// Links are followed as torchvision's ImageFolder follows them, but a file keeps the name it is
// found under (the link's, in the folder that gives its label); a link back up is a loop named
// as such, not a filesystem error 40 levels deep; a link into another class folder and a hidden
// class folder are said.
TEST(ImageFolder, LinksKeepTheirNamesAndLoopsAreNamed) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 1);
  const fs::path root = dir.path() / "root";
  fs::create_symlink(root / "class_0" / "img_0.JPEG", root / "class_1" / "link.jpg");
  {
    LogCapture log;
    ImageFolderDataset ds(root.string());
    std::vector<std::string> paths;
    for (int64_t i = 0; i < ds.size(); ++i) paths.push_back(ds.relative_path(i));
    EXPECT_EQ(paths, (std::vector<std::string>{"class_0/img_0.JPEG", "class_1/img_0.JPEG", "class_1/link.jpg"}));
    EXPECT_EQ(ds.source(2), (root / "class_1" / "link.jpg").string());
    EXPECT_EQ(log.text().find("warning"), std::string::npos) << log.text();
  }
  // A folder link into another class: its images are labelled twice, and that is said.
  fs::create_directory_symlink(root / "class_0", root / "class_1" / "more");
  {
    LogCapture log;
    ImageFolderDataset ds(root.string());
    EXPECT_EQ(ds.relative_path(ds.size() - 1), "class_1/more/img_0.JPEG");
    EXPECT_NE(log.text().find("leads into the class folder 'class_0': its images are labelled 'class_1' here as well"),
              std::string::npos)
        << log.text();
  }
  fs::remove(root / "class_1" / "more");
  fs::create_directory_symlink("..", root / "class_0" / "up");
  const std::string e = error_of([&] { ImageFolderDataset(root.string()); });
  EXPECT_NE(e.find("the link " + (root / "class_0" / "up").string() + " leads back to"), std::string::npos) << e;
  EXPECT_NE(e.find("remove the link"), std::string::npos) << e;
  fs::remove(root / "class_0" / "up");
  // A hidden folder is a class, as in torchvision, and that is said.
  make_folder(dir.path() / "hidden", 2, 1);
  fs::rename(dir.path() / "hidden" / "class_1", dir.path() / "hidden" / ".ipynb_checkpoints");
  LogCapture log;
  EXPECT_EQ(ImageFolderDataset((dir.path() / "hidden").string()).classes(),
            (std::vector<std::string>{".ipynb_checkpoints", "class_0"}));
  EXPECT_NE(log.text().find("the hidden folder '.ipynb_checkpoints' is a class"), std::string::npos) << log.text();
}

// A root of packed splits (resnet pack's output for train/ and val/) is named as such, not told
// to remove a class folder without images.
TEST(ImageFolder, ARootOfPackedSplitsIsNamed) {
  TestDir dir;
  for (const char* split : {"train", "val"}) {
    fs::create_directories(dir.path() / "packs" / split);
    write_bytes(dir.path() / "packs" / split / "dataset.json", {'{', '}'});
  }
  const std::string e = error_of([&] { ImageFolderDataset((dir.path() / "packs").string()); });
  EXPECT_NE(e.find("holds packed folders"), std::string::npos) << e;
  EXPECT_EQ(e.find("remove it"), std::string::npos) << e;
}

// A class name that is not UTF-8 is named at the listing: it could not be recorded in
// config.yaml or a checkpoint, and a run found that out at its first checkpoint.
TEST(ImageFolder, AClassNameThatIsNotUtf8IsNamed) {
  TestDir dir;
  make_folder(dir.path() / "root", 1, 1);
  make_folder(dir.path() / "tmp", 1, 1);
  fs::rename(dir.path() / "tmp" / "class_0", dir.path() / "root" / "d\xf6g");
  const std::string e = error_of([&] { ImageFolderDataset((dir.path() / "root").string()); });
  EXPECT_NE(e.find("is not UTF-8 (byte 0xf6 at 1); rename it"), std::string::npos) << e;
}

// A class folder that is a link to another class folder is said to label its images twice, as
// a link inside a class folder is.
TEST(ImageFolder, AClassFolderLinkedToAnotherIsWarnedAbout) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 1);
  fs::create_directory_symlink(dir.path() / "root" / "class_0", dir.path() / "root" / "kitty");
  LogCapture log;
  EXPECT_EQ(ImageFolderDataset((dir.path() / "root").string()).size(), 3);
  EXPECT_NE(log.text().find("the class folders 'class_0' and 'kitty' lead to the same images"), std::string::npos)
      << log.text();
}

// A folder that resnet pack left unfinished is named as such, not as a folder without classes.
TEST(ImageFolder, AnUnfinishedPackIsNamed) {
  TestDir dir;
  write_bytes(dir.path() / "out" / ".resnet-pack", {});
  write_bytes(dir.path() / "out" / "shard-00000.tar", {});
  const std::string e = error_of([&] { ImageFolderDataset((dir.path() / "out").string()); });
  EXPECT_NE(e.find("is an unfinished pack"), std::string::npos) << e;
}

TEST(ImageFolder, ListFileWithErrorsNamingTheLine) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 2);
  {
    std::ofstream list(dir.file("val.txt"));
    list << "# comment\n\nclass_0/img_0.JPEG 1\nclass_1/img_1.jpg 0\n";
  }
  ImageListDataset ds((dir.path() / "root").string(), dir.file("val.txt"));
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.label(0), 1);
  EXPECT_EQ(ds.label(1), 0);
  EXPECT_EQ(ds.num_classes(), 2);
  {
    std::ofstream list(dir.file("bad.txt"));
    list << "class_0/img_0.JPEG 1\nclass_0/missing.jpg 0\n";
  }
  std::string e = error_of([&] { ImageListDataset((dir.path() / "root").string(), dir.file("bad.txt")); });
  EXPECT_NE(e.find("bad.txt:2"), std::string::npos) << e;
  {
    std::ofstream list(dir.file("bad2.txt"));
    list << "class_0/img_0.JPEG one\n";
  }
  e = error_of([&] { ImageListDataset((dir.path() / "root").string(), dir.file("bad2.txt")); });
  EXPECT_NE(e.find("bad2.txt:1"), std::string::npos) << e;
  EXPECT_NE(e.find("not an integer"), std::string::npos) << e;
}

// A full cache counts the images it had no room for (the trainer says once that it is full, and
// the pipeline verdict advises a larger data.cache_mb rather than "the cache").
TEST(DecodedCache, CountsTheImagesItHasNoRoomFor) {
  CachedImage image;
  image.pixels.assign(300, 7);
  image.width = image.height = 10;
  DecodedCache cache(3, 2 * image.bytes(), 10);
  EXPECT_NE(cache.insert(0, image), nullptr);
  EXPECT_NE(cache.insert(1, image), nullptr);
  EXPECT_EQ(cache.refused(), 0);
  EXPECT_EQ(cache.insert(2, image), nullptr);
  EXPECT_EQ(cache.refused(), 1);
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_NE(cache.insert(1, image), nullptr) << "an image it has is no refusal";
  EXPECT_EQ(cache.refused(), 1);
}

TEST(ImageLoader, EveryImageExactlyOncePerEpochAcrossRanks) {
  TestDir dir;
  make_folder(dir.path() / "root", 3, 7);  // 21 images
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  for (int64_t epoch : {0, 1}) {
    std::multiset<int64_t> seen;
    std::vector<int64_t> orders[3];
    for (int rank = 0; rank < 3; ++rank) {
      DataLoaderOptions o = options(4, 2);
      o.drop_last = false;
      o.shard = ShardSpec{rank, 3, false};
      DataLoader loader(ds, train_augment(16), o);
      const EpochData d = run_epoch(loader, epoch);
      seen.insert(d.indices.begin(), d.indices.end());
      orders[rank] = d.indices;
      for (size_t i = 0; i < d.labels.size(); ++i) EXPECT_EQ(d.labels[i], ds->label(d.indices[i]));
    }
    EXPECT_EQ(seen.size(), 21u);
    for (int64_t i = 0; i < 21; ++i) EXPECT_EQ(seen.count(i), 1u) << "image " << i << " in epoch " << epoch;
    EXPECT_FALSE(std::is_sorted(orders[0].begin(), orders[0].end()));  // shuffled
  }
}

TEST(ImageLoader, SameBatchesWhateverTheWorkerCount) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 6);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  DataLoader inline_loader(ds, train_augment(24), options(5, 0));
  DataLoader threaded(ds, train_augment(24), options(5, 3));
  const EpochData a = run_epoch(inline_loader, 3), b = run_epoch(threaded, 3);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.pixels, b.pixels);
  // Another epoch: another order and other crops.
  const EpochData c = run_epoch(threaded, 4);
  EXPECT_NE(a.pixels, c.pixels);
}

TEST(ImageLoader, BatchIsTheDecodedCropOfEachImage) {
  TestDir dir;
  make_folder(dir.path() / "root", 1, 3);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  auto augment = train_augment(20);
  DataLoaderOptions o = options(3, 1);
  o.shuffle = false;
  DataLoader loader(ds, augment, o);
  const EpochData d = run_epoch(loader, 2);
  AugmentScratch scratch;
  EncodedImage e;
  for (int64_t i = 0; i < 3; ++i) {
    ds->read(i, e);
    const ImageInfo info = image_info(e);
    Rng rng = sample_rng(o.seed, 2, i);
    const CropPlan plan = augment->plan(info.width, info.height, rng);
    decode_image(e, plan.request, scratch.decoded);
    std::vector<uint8_t> out(20 * 20 * 3);
    render(scratch.decoded, plan, out.data(), 0, scratch.resize);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), d.pixels.begin() + i * 1200)) << "image " << i;
  }
}

// Device augmentation on encoded images: the loader still renders the random resized crop
// but leaves the flip to the device, recorded as (0, 0, flip); mirroring the deferred image
// gives the loader's own flipped rendering exactly, with and without the decoded cache.
TEST(ImageLoader, DeferredFlipIsTheRenderedFlip) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 5);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  for (size_t cache : {size_t{0}, size_t{1} << 20}) {
    DataLoaderOptions o = options(5, 2);
    o.cache_bytes = cache;
    DataLoader rendered(ds, train_augment(14), o);
    o.defer_crop_flip = true;
    DataLoader deferred(ds, train_augment(14), o);
    int flips = 0, images = 0;
    for (int64_t epoch : {0, 1}) {
      rendered.start_epoch(epoch);
      deferred.start_epoch(epoch);
      while (const Batch* a = rendered.next()) {
        const Batch* b = deferred.next();
        ASSERT_NE(b, nullptr);
        ASSERT_NE(b->crops.data, nullptr);
        EXPECT_EQ(a->crops.data, nullptr);
        const auto* pa = a->images.ptr<const uint8_t>();
        const auto* pb = b->images.ptr<const uint8_t>();
        const auto* crops = b->crops.ptr<const int32_t>();
        for (int64_t n = 0; n < b->size; ++n, ++images) {
          EXPECT_EQ(crops[3 * n], 0);
          EXPECT_EQ(crops[3 * n + 1], 0);
          const bool flip = crops[3 * n + 2] != 0;
          flips += flip;
          for (int y = 0; y < 14; ++y)
            for (int x = 0; x < 14; ++x)
              for (int c = 0; c < 3; ++c) {
                const int sx = flip ? 13 - x : x;
                ASSERT_EQ(pa[b->images.offset(n, c, y, x)], pb[b->images.offset(n, c, y, sx)])
                    << "image " << n << " (flip " << flip << ", cache " << cache << ") at " << y << ", " << x;
              }
        }
      }
    }
    EXPECT_GT(flips, 0);
    EXPECT_LT(flips, images);
  }
}

TEST(ImageLoader, NormalisedBatchesMatchTheUint8Batch) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 3);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  DataLoader u8(ds, train_augment(12), options(6, 1));
  DataLoaderOptions o = options(6, 1);
  o.dtype = DType::f32;
  o.layout = Layout::nchw;
  DataLoader f32(ds, train_augment(12), o);
  u8.start_epoch(0);
  f32.start_epoch(0);
  const Batch* a = u8.next();
  const Batch* b = f32.next();
  ASSERT_TRUE(a && b);
  const auto* pa = static_cast<const uint8_t*>(a->images.data);
  const auto* pb = static_cast<const float*>(b->images.data);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  for (int n = 0; n < 6; ++n)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 12; ++y)
        for (int x = 0; x < 12; ++x) {
          const float expect = (pa[a->images.offset(n, c, y, x)] / 255.0f - mean[c]) / std[c];
          ASSERT_FLOAT_EQ(pb[b->images.offset(n, c, y, x)], expect);
        }
  EXPECT_GT(f32.epoch_times().collate, 0.0);
  EXPECT_GT(f32.epoch_times().decode, 0.0);
  EXPECT_GT(f32.epoch_times().read, 0.0);
  EXPECT_EQ(f32.epoch_times().samples, 6);
}

TEST(ImageLoader, BadFilesAreSkippedCountedAndLoggedOnce) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 5);
  const fs::path root = dir.path() / "root";
  write_bytes(root / "class_0" / "zero.jpg", {});
  std::vector<uint8_t> truncated = jpeg_image(64, 48, 3);
  truncated.resize(truncated.size() / 2);
  write_bytes(root / "class_0" / "truncated.jpg", truncated);
  write_bytes(root / "class_1" / "text.jpg", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  auto ds = std::make_shared<ImageFolderDataset>(root.string());
  ASSERT_EQ(ds->size(), 13);

  LogCapture log;
  DataLoader loader(ds, train_augment(16), options(13, 2));
  EpochData d = run_epoch(loader, 0);
  EXPECT_EQ(d.labels.size(), 13u);
  EXPECT_EQ(loader.bad_file_count(), 3);
  EXPECT_EQ(loader.epoch_times().skipped, 3);
  // The batches mark the three bad files' slots, so that evaluation can leave them out.
  std::vector<std::string> marked;
  for (int64_t i : d.replaced) marked.push_back(fs::path(ds->source(i)).filename().string());
  std::sort(marked.begin(), marked.end());
  EXPECT_EQ(marked, (std::vector<std::string>{"text.jpg", "truncated.jpg", "zero.jpg"}));
  run_epoch(loader, 1);
  EXPECT_EQ(loader.bad_file_count(), 3);
  EXPECT_EQ(loader.epoch_times().skipped, 3);  // counted every epoch ...
  const std::string text = log.text();
  for (const char* name : {"zero.jpg", "truncated.jpg", "text.jpg"}) {
    size_t count = 0;
    for (size_t p = text.find(name); p != std::string::npos; p = text.find(name, p + 1)) ++count;
    EXPECT_EQ(count, 1u) << name << " should be logged exactly once:\n" << text;  // ... logged once
  }
  // ... and read again every epoch: a batch depends on the seed, the epoch and the sample only
  // (whether a damaged JPEG decodes can depend on the crop), as a resumed run needs.
  write_bytes(root / "class_0" / "zero.jpg", jpeg_image(40, 30, 9));
  run_epoch(loader, 2);
  EXPECT_EQ(loader.epoch_times().skipped, 2);

  DataLoaderOptions strict = options(13, 2);
  strict.bad_files = BadFilePolicy::error;
  DataLoader failing(ds, train_augment(16), strict);
  failing.start_epoch(0);
  const std::string e = error_of([&] { failing.next(); });
  EXPECT_TRUE(e.find("zero.jpg") != std::string::npos || e.find("truncated.jpg") != std::string::npos ||
              e.find("text.jpg") != std::string::npos)
      << e;
}

// A listed file that is something else when it is read (a folder, a FIFO) is a bad file like any
// other: a FIFO used to block its worker and the loader's shutdown for ever, a folder to stop
// the run with a bad_alloc that named no file.
TEST(ImageLoader, AFileThatBecameAFolderOrAFifoIsABadFile) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 3);
  const fs::path root = dir.path() / "root";
  auto ds = std::make_shared<ImageFolderDataset>(root.string());
  fs::remove(root / "class_0" / "img_1.jpg");
  fs::create_directory(root / "class_0" / "img_1.jpg");
  fs::remove(root / "class_1" / "img_2.jpg");
  ASSERT_EQ(mkfifo((root / "class_1" / "img_2.jpg").c_str(), 0600), 0);
  {
    DataLoader loader(ds, train_augment(16), options(6, 2));
    run_epoch(loader, 0);
    EXPECT_EQ(loader.epoch_times().skipped, 2);
  }
  DataLoaderOptions strict = options(6, 0);
  strict.bad_files = BadFilePolicy::error;
  DataLoader failing(ds, train_augment(16), strict);
  failing.start_epoch(0);
  const std::string e = error_of([&] { failing.next(); });
  EXPECT_NE(e.find("img_1.jpg is not a regular file (a folder)"), std::string::npos) << e;
}

TEST(ImageLoader, CacheHitsGiveIdenticalPixelsWithinTheCap) {
  TestDir dir;
  make_folder(dir.path() / "root", 2, 6);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  DataLoaderOptions o = options(4, 2);
  o.cache_bytes = 64u << 20;
  o.cache_short_side = 32;
  DataLoader warm(ds, train_augment(16), o);
  run_epoch(warm, 0);  // fills the cache
  ASSERT_EQ(warm.cache()->entries(), 12);
  const EpochData hit = run_epoch(warm, 1);
  EXPECT_EQ(warm.epoch_times().cache_hits, 12);
  EXPECT_EQ(warm.epoch_times().decode, 0.0);
  DataLoader cold(ds, train_augment(16), o);
  const EpochData miss = run_epoch(cold, 1);  // the same epoch from misses
  EXPECT_EQ(cold.epoch_times().cache_hits, 0);
  EXPECT_EQ(hit.pixels, miss.pixels);
  EXPECT_EQ(hit.labels, miss.labels);

  // A small cap: some images are cached, never more bytes than the cap.
  o.cache_bytes = 3 * (32 * 60 * 3 + sizeof(CachedImage));
  DataLoader capped(ds, train_augment(16), o);
  run_epoch(capped, 0);
  EXPECT_LE(capped.cache()->bytes_used(), o.cache_bytes);
  EXPECT_GE(capped.cache()->entries(), 1);
  EXPECT_LT(capped.cache()->entries(), 12);
  const EpochData capped_data = run_epoch(capped, 1);
  EXPECT_EQ(capped_data.pixels, miss.pixels);  // cached or not, the same pixels
}

TEST(ImageLoader, TraceHasOneSpanPerBatch) {
  TestDir dir;
  make_folder(dir.path() / "root", 1, 8);
  auto ds = std::make_shared<ImageFolderDataset>((dir.path() / "root").string());
  DataLoaderOptions o = options(2, 2);
  o.trace = std::make_shared<TraceRecorder>();
  DataLoader loader(ds, train_augment(8), o);
  run_epoch(loader, 0);
  EXPECT_EQ(o.trace->size(), 4u);
  o.trace->write(dir.file("trace.json"));
  std::ifstream in(dir.file("trace.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  int spans = 0;
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") {
      ++spans;
      names.insert(e["name"].get<std::string>());
      EXPECT_EQ(e["args"]["epoch"], 1) << e.dump();  // counted from 1, as the log counts
    }
  EXPECT_EQ(spans, 4);
  EXPECT_TRUE(names.count("load batch 1 of epoch 1") && names.count("load batch 4 of epoch 1")) << j.dump();
}

}  // namespace
}  // namespace rn

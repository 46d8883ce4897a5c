// Image folders label class folders by name (data.classes): a validation folder that lacks a
// class keeps the training labels, one with a class training never had is an error, and a run
// records its classes so that eval labels as training did.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/encoded_dataset.h"
#include "data/image_folder_files.h"
#include "log_capture.h"
#include "test_dir.h"
#include "train/config.h"
#include "train/data_setup.h"
#include "train/trainer.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

Config folder_config(const std::string& root, const std::string& out_dir) {
  Config c;
  c.model.name = "resnet20";
  c.model.num_classes = 3;
  c.model.in_channels = 3;
  c.model.image_size = {16, 16};
  c.data.dataset = DatasetKind::imagefolder;
  c.data.root = root;
  c.data.mean = {0.5, 0.5, 0.5};
  c.data.std = {0.25, 0.25, 0.25};
  c.data.augment.eval_resize = 16;
  c.data.batch_size = 2;
  c.data.workers = 1;
  c.schedule.epochs = 1;
  c.run.device = DeviceChoice::cpu;
  c.run.threads = 1;
  c.run.out_dir = out_dir;
  c.validate();
  return c;
}

// Every sample's label, in the dataset's order.
std::vector<int> labels_of(const DataLoader& loader) {
  const auto& ds = dynamic_cast<const EncodedDataset&>(loader.dataset());
  std::vector<int> labels;
  EncodedImage img;
  for (int64_t i = 0; i < ds.size(); ++i) labels.push_back(ds.read(i, img));
  return labels;
}

TEST(ImageFolderClasses, ValidationWithoutAClassKeepsTheTrainingLabels) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 3, 2);
  test::write_image_folder(dir.path() / "data/val", 3, 1);
  fs::remove_all(dir.path() / "data/val/class_1");
  const Config cfg = folder_config(dir.file("data"), dir.file("run"));
  const Loaders l = make_loaders(cfg, DType::f32, Layout::nhwc);
  EXPECT_EQ(l.classes, (std::vector<std::string>{"class_0", "class_1", "class_2"}));
  EXPECT_EQ(labels_of(*l.train), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  // class_2 is label 2, as in training, not 1 (its position in the validation folder).
  EXPECT_EQ(labels_of(*l.val), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.val->dataset().num_classes(), 3);
}

TEST(ImageFolderClasses, AClassTrainingNeverHadIsAnError) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 2, 2);
  test::write_image_folder(dir.path() / "data/val", 3, 1);
  const Config cfg = folder_config(dir.file("data"), dir.file("run"));
  try {
    make_loaders(cfg, DType::f32, Layout::nhwc);
    ADD_FAILURE() << "a validation class unknown to training was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("has class 'class_2'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.classes: class_0, class_1"), std::string::npos) << msg;
  }
}

TEST(ImageFolderClasses, DataClassesSetTheLabelsByName) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 2, 1);
  Config cfg = folder_config(dir.file("data"), dir.file("run"));
  cfg.data.classes = {"class_1", "extra", "class_0"};
  cfg.validate();
  const Loaders l = make_loaders(cfg, DType::f32, Layout::nhwc);
  EXPECT_EQ(labels_of(*l.train), (std::vector<int>{2, 0}));  // class_0 -> 2, class_1 -> 0
  // Config checks: no duplicates or blanks, no more than the model's outputs, only image folders.
  auto yaml = [](const std::string& classes, int num_classes) {
    return "model:\n  in_channels: 3\n  num_classes: " + std::to_string(num_classes) +
           "\ndata:\n  dataset: imagefolder\n  mean: [0.5, 0.5, 0.5]\n  std: [0.5, 0.5, 0.5]\n  classes: " + classes +
           "\n";
  };
  EXPECT_EQ(load_config_from_string(yaml("[a, b, c]", 3)).data.classes, (std::vector<std::string>{"a", "b", "c"}));
  for (const auto& [classes, expected] : std::vector<std::pair<std::string, std::string>>{
           {"[a, b, a]", "names class 'a' twice"}, {"[a, '']", "empty class name"}, {"[a, b, c, d]", "lists 4"}}) {
    try {
      load_config_from_string(yaml(classes, 3));
      ADD_FAILURE() << classes << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_config_from_string("data:\n  classes: [a, b]\n"), Error) << "Fashion-MNIST with class names";
}

// A subset of an image folder is drawn at random (fixed by run.seed), not the first class.
TEST(ImageFolderClasses, SubsetsSpanTheClasses) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 4, 5);
  Config cfg = folder_config(dir.file("data"), dir.file("run"));
  cfg.model.num_classes = 4;
  cfg.data.train_subset = 5;
  cfg.validate();
  const std::vector<int> labels = labels_of(*make_loaders(cfg, DType::f32, Layout::nhwc).train);
  ASSERT_EQ(labels.size(), 5u);
  EXPECT_GT(std::set<int>(labels.begin(), labels.end()).size(), 1u) << "the first 5 files are all class_0";
  EXPECT_EQ(labels_of(*make_loaders(cfg, DType::f32, Layout::nhwc).train), labels) << "not fixed by the seed";
}

// A run records its classes in config.yaml; eval of that config labels a validation folder
// without class_1 as training did. Too many model outputs for the data give a warning.
TEST(ImageFolderClasses, RunsRecordTheirClassesForEval) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 3, 2);
  Config cfg = folder_config(dir.file("data"), dir.file("run"));
  cfg.model.num_classes = 5;
  cfg.validate();
  TrainOptions o;
  o.max_steps = 1;
  std::string log;
  TrainResult r;
  {
    LogCapture capture;
    r = train(cfg, o);
    log = capture.text();
  }
  EXPECT_NE(log.find("model.num_classes is 5 but the training data has 3 classes"), std::string::npos) << log;
  const Config recorded = load_config(r.run_dir + "/config.yaml");
  EXPECT_EQ(recorded.data.classes, (std::vector<std::string>{"class_0", "class_1", "class_2"}));
  // Given relative to the working directory, the data folder is recorded absolute, so that eval
  // and resume find it from anywhere.
  Config relative = cfg;
  relative.data.root = fs::relative(dir.path() / "data", fs::current_path()).string();
  ASSERT_NE(relative.data.root.front(), '/');
  relative.run.out_dir = dir.file("run_relative");
  const TrainResult rr = train(relative, o);
  EXPECT_EQ(load_config(rr.run_dir + "/config.yaml").data.root, (dir.path() / "data").lexically_normal().string());

  Config eval_cfg = recorded;
  test::write_image_folder(dir.path() / "other", 3, 1);
  fs::remove_all(dir.path() / "other/class_1");
  eval_cfg.data.root = dir.file("other");
  EXPECT_EQ(labels_of(*make_val_loader(eval_cfg, DType::f32, Layout::nhwc)), (std::vector<int>{0, 2}));
  // Without recorded classes (imported weights), labels follow the folder, with a warning.
  eval_cfg.data.classes.clear();
  LogCapture capture;
  EXPECT_EQ(labels_of(*make_val_loader(eval_cfg, DType::f32, Layout::nhwc)), (std::vector<int>{0, 1}));
  EXPECT_NE(capture.text().find("class names are not recorded"), std::string::npos) << capture.text();
}

// The cache serves training only: validation (and eval) figures must not depend on it, and a
// cache whose images are smaller than the model's input is said.
TEST(ImageFolderCache, ValidationReadsPastTheCache) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 3, 2);
  test::write_image_folder(dir.path() / "data/val", 3, 1);
  Config cfg = folder_config(dir.file("data"), dir.file("run"));
  cfg.data.cache_mb = 4;
  cfg.data.cache_short_side = 8;  // below the 16x16 input
  cfg.validate();
  LogCapture log;
  const Loaders l = make_loaders(cfg, DType::f32, Layout::nhwc);
  EXPECT_EQ(l.train->options().cache_bytes, size_t{4} << 20);
  EXPECT_EQ(l.val->options().cache_bytes, 0u);
  EXPECT_EQ(make_val_loader(cfg, DType::f32, Layout::nhwc)->options().cache_bytes, 0u);
  EXPECT_NE(log.text().find("data.cache_short_side 8 is below the model's input of 16x16"), std::string::npos)
      << log.text();
}

// validation/ and valid/ are the validation split as val/ is; a test/ beside train/ is only
// named in the warning (a test set is not for choosing checkpoints).
TEST(ImageFolderPaths, ValidationFolderNamesAndTheTestSetHint) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data/train", 3, 2);
  test::write_image_folder(dir.path() / "data/validation", 3, 1);
  Config cfg = folder_config(dir.file("data"), dir.file("run"));
  EXPECT_EQ(image_folder_paths(cfg.data).val, (dir.path() / "data/validation").string());
  fs::rename(dir.path() / "data/validation", dir.path() / "data/valid");
  EXPECT_EQ(image_folder_paths(cfg.data).val, (dir.path() / "data/valid").string());
  fs::rename(dir.path() / "data/valid", dir.path() / "data/test");
  EXPECT_TRUE(image_folder_paths(cfg.data).val_is_train);
  LogCapture log;
  make_loaders(cfg, DType::f32, Layout::nhwc);
  EXPECT_NE(log.text().find("evaluating on the training images (to evaluate on its test set: data.val_root=" +
                            (dir.path() / "data/test").string() + ")"),
            std::string::npos)
      << log.text();
}

// A resume may move data.root (the run's config.yaml records it, made absolute as a fresh run's
// is, so that a later resume or eval from elsewhere finds it), but not to a training set of
// another size: the schedule and the place in the epoch are laid out on its steps.
TEST(ImageFolderPaths, AResumeMayMoveTheDataButNotToAnotherSize) {
  TestDir dir;
  test::write_image_folder(dir.path() / "a/train", 3, 4);  // 12 images: 6 steps of 2
  test::write_image_folder(dir.path() / "a/val", 3, 1);
  fs::copy(dir.path() / "a", dir.path() / "b", fs::copy_options::recursive);
  test::write_image_folder(dir.path() / "c/train", 3, 3);  // 9 images: 4 steps
  test::write_image_folder(dir.path() / "c/val", 3, 1);
  const Config cfg = folder_config(dir.file("a"), dir.file("run"));
  TrainOptions first;
  first.max_steps = 2;
  const TrainResult r = train(cfg, first);
  ASSERT_EQ(r.steps, 2);
  TrainOptions resume;
  resume.resume_dir = r.run_dir;
  resume.max_steps = 3;
  resume.resume_overrides = {"data.root=" + dir.file("c")};
  try {
    train(cfg, resume);
    ADD_FAILURE() << "resumed on a training set of another size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it was trained on 12 samples, 6 steps an epoch, and data.root '" +
                                         dir.file("c") + "' now gives 9, 4 steps an epoch"),
              std::string::npos)
        << e.what();
  }
  const fs::path here = fs::current_path();
  fs::current_path(dir.path());
  resume.resume_overrides = {"data.root=b"};
  const int64_t steps = train(cfg, resume).steps;
  fs::current_path(here);
  EXPECT_EQ(steps, 3);
  std::ifstream in(r.run_dir + "/config.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(yaml.find("root: " + dir.file("b") + "\n"), std::string::npos) << yaml;
}

}  // namespace
}  // namespace rn

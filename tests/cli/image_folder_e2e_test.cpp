// End to end on an image folder: `resnet train --data DIR` on a small generated ImageFolder
// (JPEGs of four colours, one corrupt file), then `resnet eval` and `resnet bench --data`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "train/metrics.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

// Runs the resnet binary with `args`; returns the exit code and fills `output`.
int run(const std::string& args, std::string* output) {
  const std::string cmd = std::string(RN_BINARY_DIR) + "/resnet " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  output->clear();
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Class c is a colour (with a gradient and varying sizes), easy to learn in a few steps.
void make_dataset(const fs::path& root, int per_class_train, int per_class_val) {
  const uint8_t colours[4][3] = {{220, 40, 40}, {40, 200, 40}, {40, 60, 220}, {230, 220, 50}};
  for (const char* split : {"train", "val"}) {
    const int n = std::string(split) == "train" ? per_class_train : per_class_val;
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < n; ++i) {
        const int w = 40 + (i * 7) % 30, h = 36 + (i * 5) % 24;
        std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
        for (int y = 0; y < h; ++y)
          for (int x = 0; x < w; ++x)
            for (int k = 0; k < 3; ++k)
              rgb[(static_cast<size_t>(y) * w + x) * 3 + k] =
                  static_cast<uint8_t>(std::min(255, colours[c][k] + (x + y + i) % 25));
        std::vector<uint8_t> jpeg;
        encode_jpeg(rgb.data(), w, h, 90, jpeg);
        write_file(root / split / ("class" + std::to_string(c)) / ("im" + std::to_string(i) + ".jpg"), jpeg);
      }
    }
  }
  write_file(root / "train" / "class0" / "broken.jpg", {});  // a zero-byte file: skipped and counted
}

TEST(ImageFolderE2E, TrainEvalAndBenchOnAGeneratedFolder) {
  const fs::path root = fs::path(RN_BINARY_DIR) / "test_runs" / "imagefolder_e2e";
  fs::remove_all(root);
  make_dataset(root / "data", 32, 8);
  const fs::path run_dir = root / "run";
  std::string out;
  const std::string common =
      " --set model.image_size=[32,32] --set data.augment.eval_resize=36"
      " --set data.batch_size=16 --set data.workers=2 --set run.threads=2";
  ASSERT_EQ(run("train --data " + (root / "data").string() + common +
                    " --set schedule.epochs=4 --set optimizer.base_lr=0.4 --set run.log_interval_steps=4"
                    " --set run.trace=true --set run.out_dir=" +
                    run_dir.string(),
                &out),
            0)
      << out;
  double top1 = -1;
  int pipeline_records = 0;
  for (const auto& rec : read_metrics((run_dir / "metrics.jsonl").string())) {
    if (rec.value("kind", "") == "eval") top1 = rec.at("top1").get<double>();
    if (rec.value("kind", "") == "pipeline") {
      ++pipeline_records;
      EXPECT_GT(rec.at("decode_s").get<double>(), 0.0);
      EXPECT_EQ(rec.at("skipped").get<int64_t>(), 1);  // the broken file, once per epoch
    }
  }
  EXPECT_GT(top1, 0.5) << "4 classes: chance is 0.25\n" << out;
  EXPECT_EQ(pipeline_records, 4);
  std::ifstream log_file(run_dir / "train.log");
  const std::string log{std::istreambuf_iterator<char>(log_file), std::istreambuf_iterator<char>()};
  EXPECT_NE(log.find("verdict: compute-bound"), std::string::npos) << log;
  size_t mentions = 0;
  for (size_t p = log.find("broken.jpg"); p != std::string::npos; p = log.find("broken.jpg", p + 1)) ++mentions;
  EXPECT_EQ(mentions, 1u) << "a bad file is logged once";
  EXPECT_TRUE(fs::exists(run_dir / "trace.json"));
  // --data without --config gives the model as many outputs as the folder has classes.
  std::ifstream config_file(run_dir / "config.yaml");
  const std::string config{std::istreambuf_iterator<char>(config_file), std::istreambuf_iterator<char>()};
  EXPECT_NE(config.find("num_classes: 4\n"), std::string::npos) << config;
  EXPECT_EQ(log.find("outputs are never"), std::string::npos) << log;

  ASSERT_EQ(run("eval --weights " + (run_dir / "checkpoints" / "best.safetensors").string() + " --data " +
                    (root / "data").string(),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("top-1"), std::string::npos) << out;
  EXPECT_NE(out.find("(32 images)"), std::string::npos) << out;

  // A folder without class1 keeps the labels training gave (by class name, from the recorded
  // data.classes: class2 stays 2), and the predictions name each image.
  const fs::path partial = root / "partial";
  for (const char* c : {"class0", "class2"}) {
    fs::create_directories(partial / c);
    fs::copy(root / "data" / "val" / c, partial / c, fs::copy_options::recursive);
  }
  const fs::path csv = root / "partial.csv";
  ASSERT_EQ(run("eval --weights " + (run_dir / "checkpoints" / "best.safetensors").string() + " --data " +
                    partial.string() + " --predictions " + csv.string(),
                &out),
            0)
      << out;
  std::ifstream preds(csv);
  std::string line;
  std::getline(preds, line);
  EXPECT_NE(line.find(",source,label_name,name1,"), std::string::npos) << line;
  int rows = 0;
  while (std::getline(preds, line)) {
    ++rows;
    const std::string label = line.substr(line.find(',') + 1, line.find(',', line.find(',') + 1) - line.find(',') - 1);
    const bool class2 = line.find("/class2/im") != std::string::npos;
    EXPECT_TRUE(class2 || line.find("/class0/im") != std::string::npos) << line;
    EXPECT_EQ(label, class2 ? "2" : "0") << line;
    // The label's name (after the source) is the recorded class folder's.
    EXPECT_NE(line.find(class2 ? "\",\"class2\"," : "\",\"class0\","), std::string::npos) << line;
  }
  EXPECT_EQ(rows, 16);
  // An evaluation that fails (here on the broken file) leaves an existing predictions file as it
  // was: it used to be emptied before the evaluation began.
  preds.close();
  std::ifstream before_stream(csv);
  const std::string before((std::istreambuf_iterator<char>(before_stream)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(before.empty());
  EXPECT_NE(run("eval --weights " + (run_dir / "checkpoints" / "best.safetensors").string() + " --data " +
                    (root / "data" / "train").string() + " --set data.bad_files=error --predictions " + csv.string(),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("broken.jpg"), std::string::npos) << out;
  std::ifstream after_stream(csv);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(after_stream)), std::istreambuf_iterator<char>()), before);

  ASSERT_EQ(run("bench --data " + (root / "data" / "train").string() +
                    " --batch 16 --input 3x32x32 --threads 2 --warmup 1 --json",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("\"images_per_sec\""), std::string::npos) << out;
  // 128 images (one broken): 8 batches of 16; 1 warm-up and the 2 batches the 2 workers make
  // ahead are not counted (made before the clock started, they gave millions of images/s on
  // small folders), so 5 are: 80 images, 79 if the broken file's batch is among them.
  EXPECT_NE(out.find("\"warmup_batches\":1,\"uncounted_batches\":2"), std::string::npos) << out;
  const auto images_at = out.find("\"images\":");
  ASSERT_NE(images_at, std::string::npos) << out;
  const int images = std::stoi(out.substr(images_at + 9));
  EXPECT_TRUE(images == 80 || images == 79) << out;
  // So few timed batches next to the prefetched ones read low (their making is timed): said.
  EXPECT_NE(out.find("note: 5 batches are timed against 2 made ahead uncounted: the rate may read up to 29% low; 176 "
                     "images or more"),
            std::string::npos)
      << out;
  // A folder too small for warm-up, prefetch and one timed batch says so, naming the options.
  EXPECT_NE(run("bench --data " + (root / "data" / "train").string() + " --batch 32 --warmup 2 --threads 2", &out), 0);
  EXPECT_NE(out.find("has too few images: 4 batches of 32 per epoch, and the timing needs 2 warm-up, the 2 the "
                     "workers make ahead"),
            std::string::npos)
      << out;

  // A strict policy names the bad file and stops.
  EXPECT_NE(
      run("train --data " + (root / "data").string() + common +
              " --set data.bad_files=error --set schedule.epochs=1 --set run.out_dir=" + (root / "strict").string(),
          &out),
      0);
  EXPECT_NE(out.find("broken.jpg"), std::string::npos) << out;
  // A resumed run keeps its own data: --data with --resume is refused, not ignored.
  EXPECT_NE(run("train --resume " + run_dir.string() + " --data " + (root / "data").string(), &out), 0);
  EXPECT_NE(out.find("cannot change it"), std::string::npos) << out;
  // A missing folder is an error at start.
  EXPECT_NE(run("train --data " + (root / "nope").string() + " --set run.out_dir=" + (root / "x").string(), &out), 0);
  EXPECT_NE(out.find("is not a folder"), std::string::npos) << out;
  // A run folder given as the weights: its best weights file is named.
  EXPECT_NE(run("eval --weights " + run_dir.string(), &out), 0);
  EXPECT_NE(out.find("is a run folder; give one of its weights files, such as " +
                     (run_dir / "checkpoints" / "best.safetensors").string()),
            std::string::npos)
      << out;
  // Evaluating a checkpoint whose recorded data has moved says where the folder came from.
  fs::rename(root / "data", root / "moved");
  EXPECT_NE(run("eval --weights " + (run_dir / "checkpoints" / "best.safetensors").string(), &out), 0);
  EXPECT_NE(out.find("best.safetensors's recorded config) is not a folder here; give the images with --data DIR"),
            std::string::npos)
      << out;
}

// --data with a data.classes that lists a class the folder lacks (docs/images.md allows it):
// the model gets the listed classes' outputs, not the folder count (which refused the list),
// and the run warns of the class without images.
TEST(ImageFolderE2E, DataClassesMayListAClassTheFolderLacks) {
  const fs::path root = fs::path(RN_BINARY_DIR) / "test_runs" / "imagefolder_classes";
  fs::remove_all(root);
  make_dataset(root / "data", 4, 1);  // class0..class3
  std::string out;
  ASSERT_EQ(run("train --data " + (root / "data").string() +
                    " --set \"data.classes=[class0, class1, class2, class3, birds]\" --max-steps 1"
                    " --set model.image_size=[32,32] --set data.augment.eval_resize=36 --set data.batch_size=4"
                    " --set run.threads=2 --set run.out_dir=" +
                    (root / "run").string(),
                &out),
            0)
      << out;
  EXPECT_NE(
      out.find("data.classes lists 1 class that " + (root / "data" / "train").string() + " has no images of (birds)"),
      std::string::npos)
      << out;
  std::ifstream config_file(root / "run" / "config.yaml");
  const std::string config{std::istreambuf_iterator<char>(config_file), std::istreambuf_iterator<char>()};
  EXPECT_NE(config.find("num_classes: 5"), std::string::npos) << config;
}

// Data that cannot fit the model is named for what it is: one class folder is not a
// model.num_classes=1 the user never wrote, and a Fashion-MNIST model is not sent to an image
// folder to look for IDX files there.
TEST(ImageFolderE2E, OneClassAndIdxModelsAreNamed) {
  const fs::path root = fs::path(RN_BINARY_DIR) / "test_runs" / "imagefolder_misfits";
  fs::remove_all(root);
  make_dataset(root / "data", 2, 1);
  fs::create_directories(root / "one");
  fs::rename(root / "data" / "train" / "class1", root / "one" / "only");
  std::string out;
  EXPECT_NE(run("train --data " + (root / "one").string() + " --set run.out_dir=" + (root / "x").string(), &out), 0);
  EXPECT_NE(out.find("are all of one class (one class folder), and a classifier needs at least 2"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("--set model.num_classes"), std::string::npos) << out;
  // bench --data: a trace path that cannot be written fails before the work; --epochs 0 is refused.
  EXPECT_NE(run("bench --data " + (root / "data" / "train").string() + " --batch 2 --trace " +
                    (root / "nope" / "t.json").string(),
                &out),
            0);
  EXPECT_NE(out.find("--trace '" + (root / "nope" / "t.json").string() + "': the folder"), std::string::npos) << out;
  EXPECT_EQ(out.find("img/s"), std::string::npos) << out;
  EXPECT_NE(run("bench --data " + (root / "data" / "train").string() + " --batch 2 --epochs 0", &out), 0);
  EXPECT_NE(out.find("--epochs"), std::string::npos) << out;

  // A Fashion-MNIST model (the built-in recipe), one step, then evaluated on an image folder.
  ASSERT_EQ(run("train --max-steps 1 --set data.train_subset=64 --set data.val_subset=64 --set data.batch_size=32"
                " --set run.threads=2 --set run.out_dir=" +
                    (root / "fm").string(),
                &out),
            0)
      << out;
  fs::path weights;
  for (const auto& e : fs::recursive_directory_iterator(root / "fm"))
    if (e.path().extension() == ".safetensors") weights = e.path();
  ASSERT_FALSE(weights.empty()) << out;
  EXPECT_NE(run("eval --weights " + weights.string() + " --data " + (root / "data" / "val").string(), &out), 0);
  EXPECT_NE(out.find("is a model of Fashion-MNIST's 1-channel 28x28 images, read from IDX files"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("install Debian's"), std::string::npos) << out;
}

// A mistyped command is named, with the nearest command, not taken for a missing one.
TEST(Cli, AMistypedCommandIsNamed) {
  std::string out;
  EXPECT_NE(run("trian --max-steps 2", &out), 0);
  EXPECT_NE(out.find("'trian' is not a command (did you mean 'train'?)"), std::string::npos) << out;
  EXPECT_EQ(out.find("A subcommand is required"), std::string::npos) << out;
}

}  // namespace
}  // namespace rn

// `resnet pack` end to end: the real binary on a tiny ImageFolder of synthetic JPEGs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "data/image_folder.h"
#include "data/image_folder_files.h"
#include "data/shard_dataset.h"
#include "train/test_dir.h"

namespace rn {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string read_all(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs `resnet <args>` with stdout and stderr to files; returns the exit status.
int run_resnet(const std::string& args, const TestDir& dir) {
  const std::string cmd =
      std::string(RN_BINARY_DIR) + "/resnet " + args + " > " + dir.file("stdout") + " 2> " + dir.file("stderr");
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST(PackCli, PacksAFolderIntoShardsThatReadBack) {
  TestDir dir;
  test::write_image_folder(dir.path() / "src", 2, 5);
  ASSERT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("out") +
                           " --records-per-shard 4 --workers 2 "
                           "--max-size 30 --quality 85",
                       dir),
            0)
      << read_all(dir.file("stderr"));
  EXPECT_THAT(read_all(dir.file("stdout")), HasSubstr("packed 10 records into 3 shards"));
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("100%"));
  const ShardDataset shards(dir.file("out"));
  ASSERT_EQ(shards.size(), 10);
  EXPECT_EQ(shards.classes(), (std::vector<std::string>{"class_0", "class_1"}));
  for (int64_t i = 0; i < shards.size(); ++i) {
    EXPECT_EQ(shards.label(i), i / 5);
    EXPECT_LE(std::min(shards.stored_width(i), shards.stored_height(i)), 30);
  }
  EXPECT_EQ(shards.manifest().max_size, 30);
  EXPECT_EQ(shards.manifest().quality, 85);

  // A rerun keeps every shard.
  ASSERT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("out") +
                           " --records-per-shard 4 --max-size 30 "
                           "--quality 85",
                       dir),
            0);
  EXPECT_THAT(read_all(dir.file("stdout")), HasSubstr("3 kept from an earlier run"));
  // ... and says it wrote nothing and repacked nothing (it reported the whole pack as written
  // and a rate for work it had not done). The time is not pinned: it includes the fsyncs of the
  // marker and dataset.json, which can take longer than 0.05 s on a busy disk.
  EXPECT_THAT(read_all(dir.file("stdout")),
              ContainsRegex("in [0-9]+\\.[0-9] s, nothing repacked\nread 0 B, wrote 0 B \\(the pack: "));
}

TEST(PackCli, PacksAListFileAsRawPixels) {
  TestDir dir;
  test::write_image_folder(dir.path() / "src", 1, 3);
  std::ofstream(dir.file("val.txt")) << "# path label\nclass_0/img_2.jpg 4\nclass_0/img_0.jpg 1\n";
  ASSERT_EQ(
      run_resnet("pack " + dir.file("src") + " " + dir.file("out") + " --list " + dir.file("val.txt") + " --raw", dir),
      0)
      << read_all(dir.file("stderr"));
  const ShardDataset shards(dir.file("out"));
  ASSERT_EQ(shards.size(), 2);
  EXPECT_EQ(shards.key(0), "class_0/img_2");
  EXPECT_EQ(shards.label(0), 4);
  EXPECT_EQ(shards.label(1), 1);
  EXPECT_EQ(shards.num_classes(), 5);
  EXPECT_TRUE(shards.manifest().raw);

  // A relabelled list repacks the shard: the labels are part of what a rerun compares.
  std::ofstream(dir.file("val.txt")) << "class_0/img_2.jpg 3\nclass_0/img_0.jpg 1\n";
  ASSERT_EQ(
      run_resnet("pack " + dir.file("src") + " " + dir.file("out") + " --list " + dir.file("val.txt") + " --raw", dir),
      0);
  EXPECT_THAT(read_all(dir.file("stdout")), HasSubstr(", 0 kept"));
  EXPECT_EQ(ShardDataset(dir.file("out")).label(0), 3);
}

std::map<std::string, std::string> folder_contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_all(e.path());
  return out;
}

// SIGKILL while shards are being written (as soon as the first index appears), then a rerun:
// the folder must equal a clean pack's, byte for byte.
TEST(PackCli, APackKilledMidwayIsFinishedByARerun) {
  TestDir dir;
  test::write_image_folder(dir.path() / "src", 4, 30);
  const std::string args = " --records-per-shard 6 --workers 2 --max-size 20";
  ASSERT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("clean") + args, dir), 0);

  const pid_t pid = fork();
  if (pid == 0) {
    const std::string binary = std::string(RN_BINARY_DIR) + "/resnet";
    std::freopen("/dev/null", "w", stderr);
    std::freopen("/dev/null", "w", stdout);
    execl(binary.c_str(), binary.c_str(), "pack", dir.file("src").c_str(), dir.file("out").c_str(),
          "--records-per-shard", "6", "--workers", "2", "--max-size", "20", static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(dir.file("out/shard-00000.idx")) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool killed = WIFSIGNALED(status);
  if (killed) {
    EXPECT_FALSE(fs::exists(dir.file("out/dataset.json"))) << "written last";
  } else {
    std::printf("note: the first pack finished before the kill\n");
  }

  ASSERT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("out") + args, dir), 0)
      << read_all(dir.file("stderr"));
  if (killed) {
    EXPECT_THAT(read_all(dir.file("stdout")), Not(HasSubstr(", 0 kept"))) << "shard 0 was complete";
  }
  EXPECT_EQ(folder_contents(dir.file("out")), folder_contents(dir.file("clean")))
      << (killed ? "killed mid-pack" : "the first pack finished before the kill");
}

// A folder holding another source's pack is not replaced without --overwrite; a rerun of the
// same source, however its path is spelled, is; the source folder itself and a root of
// splits are refused before any work.
TEST(PackCli, AnotherSourcesPackIsNotReplacedSilently) {
  TestDir dir;
  test::write_image_folder(dir.path() / "data" / "train", 2, 3);
  test::write_image_folder(dir.path() / "data" / "val", 2, 1);
  const std::string train = dir.file("data/train"), val = dir.file("data/val"), out = dir.file("out");
  ASSERT_EQ(run_resnet("pack " + train + " " + out, dir), 0) << read_all(dir.file("stderr"));
  const std::string manifest = read_all(dir.file("out/dataset.json"));

  EXPECT_EQ(run_resnet("pack " + val + " " + out, dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("already holds a pack of imagefolder:" + train + " (6 records"));
  EXPECT_EQ(read_all(dir.file("out/dataset.json")), manifest) << "the refused pack touched the folder";
  EXPECT_EQ(ShardDataset(out).size(), 6);

  EXPECT_EQ(run_resnet("pack " + dir.file("data/val/../train") + " " + out, dir), 0) << read_all(dir.file("stderr"));
  EXPECT_THAT(read_all(dir.file("stdout")), HasSubstr("1 kept from an earlier run"));

  ASSERT_EQ(run_resnet("pack " + val + " " + out + " --overwrite", dir), 0) << read_all(dir.file("stderr"));
  EXPECT_EQ(ShardDataset(out).size(), 2);

  EXPECT_EQ(run_resnet("pack " + train + " " + dir.file("data/train/packed"), dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("is inside the source folder"));
  EXPECT_EQ(run_resnet("pack " + train + " " + train, dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("is the source folder"));
  EXPECT_FALSE(fs::exists(dir.file("data/train/packed")));

  EXPECT_EQ(run_resnet("pack " + dir.file("data") + " " + dir.file("out2"), dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("holds the splits train/, val/"));

  // Shard files that no pack of ours left (another tool's WebDataset) are not deleted without
  // --overwrite, nor is a folder of folders (an image folder) packed into, which its new
  // dataset.json would hide.
  fs::create_directories(dir.path() / "foreign");
  for (int i = 0; i < 3; ++i) std::ofstream(dir.file("foreign/shard-0000" + std::to_string(i) + ".tar")) << "x";
  EXPECT_EQ(run_resnet("pack " + val + " " + dir.file("foreign"), dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("holds shard files ('shard-0000"));
  EXPECT_TRUE(fs::exists(dir.file("foreign/shard-00002.tar")));
  EXPECT_EQ(run_resnet("pack " + val + " " + dir.file("foreign") + " --overwrite", dir), 0)
      << read_all(dir.file("stderr"));
  EXPECT_EQ(run_resnet("pack " + val + " " + train, dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("holds folders ('class_0/')"));
  EXPECT_FALSE(fs::exists(dir.file("data/train/dataset.json")));

  // A pack as the source is packed again (here as raw pixels), with its records and classes.
  ASSERT_EQ(run_resnet("pack " + out + " " + dir.file("raw") + " --raw", dir), 0) << read_all(dir.file("stderr"));
  EXPECT_THAT(read_all(dir.file("stdout")), HasSubstr("packed 2 records into 1 shard ("));
  EXPECT_EQ(ShardDataset(dir.file("raw")).size(), 2);
  EXPECT_FALSE(fs::exists(dir.file("raw/.resnet-pack"))) << "a finished pack keeps no marker";
}

TEST(PackCli, AMissingSourceIsOneClearError) {
  TestDir dir;
  EXPECT_EQ(run_resnet("pack " + dir.file("nowhere") + " " + dir.file("out"), dir), 1);
  const std::string err = read_all(dir.file("stderr"));
  EXPECT_THAT(err, HasSubstr("resnet: error:"));
  EXPECT_THAT(err, HasSubstr("nowhere"));

  test::write_image_folder(dir.path() / "src", 1, 1);
  std::ofstream(dir.file("a_file")) << "x";
  EXPECT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("a_file"), dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")),
              HasSubstr("pack: the output '" + dir.file("a_file") + "' is a file, not a folder"));
  // One class folder packs, with a warning: it is more often a class folder given by mistake.
  EXPECT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("one"), dir), 0);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("has one class ('class_0'); a classifier needs at least 2"));
  // A shard size past 2^63 bytes converted to 0 and packed one record per shard.
  EXPECT_EQ(run_resnet("pack " + dir.file("src") + " " + dir.file("huge") + " --shard-mb 1e30", dir), 1);
  EXPECT_THAT(read_all(dir.file("stderr")), HasSubstr("--shard-mb 1e+30 is more than any file holds"));
}

}  // namespace
}  // namespace rn

// Where an output file is written when its path is not a plain file: a symbolic link is kept
// and its target replaced (atomically); a pipe or a device is written in place (renaming a
// file over it would destroy it, and its reader would wait for ever); safetensors files, which
// are only ever written atomically, refuse a pipe or a device.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/tensor.h"
#include "model/safetensors.h"
#include "test_dir.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(OutputTarget, ASymbolicLinkIsKeptAndItsTargetReplaced) {
  TestDir dir;
  fs::create_directories(dir.file("data"));
  { std::ofstream(dir.file("data/preds.csv")) << "old"; }
  fs::create_symlink("data/preds.csv", dir.file("link.csv"));  // relative to the link's folder
  fs::create_symlink(dir.file("link.csv"), dir.file("link2.csv"));
  write_file_atomic(dir.file("link2.csv"), std::string_view("new"));
  EXPECT_TRUE(fs::is_symlink(dir.file("link2.csv")));
  EXPECT_TRUE(fs::is_symlink(dir.file("link.csv")));
  EXPECT_EQ(slurp(dir.file("data/preds.csv")), "new");
  // A dangling link: its target is made.
  fs::create_symlink("data/fresh.csv", dir.file("dangling.csv"));
  write_file_atomic(dir.file("dangling.csv"), std::string_view("made"));
  EXPECT_TRUE(fs::is_symlink(dir.file("dangling.csv")));
  EXPECT_EQ(slurp(dir.file("data/fresh.csv")), "made");
  // A loop of links is an error naming the path.
  fs::create_symlink(dir.file("loop_b"), dir.file("loop_a"));
  fs::create_symlink(dir.file("loop_a"), dir.file("loop_b"));
  try {
    write_file_atomic(dir.file("loop_a"), std::string_view("x"));
    ADD_FAILURE() << "wrote through a loop of links";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too many levels of symbolic links"), std::string::npos) << e.what();
  }
  // A safetensors file behind a link: the link is kept too.
  HostTensor t({3}, DType::f32);
  for (int i = 0; i < 3; ++i) t.view().ptr<float>()[i] = static_cast<float>(i);
  fs::create_symlink("data/w.safetensors", dir.file("w.safetensors"));
  write_safetensors(dir.file("w.safetensors"), {{"w", t.view()}});
  EXPECT_TRUE(fs::is_symlink(dir.file("w.safetensors")));
  EXPECT_TRUE(fs::is_regular_file(dir.file("data/w.safetensors")));
  EXPECT_EQ(SafetensorsFile::load(dir.file("w.safetensors")).view("w").ptr<float>()[2], 2.0f);
}

TEST(OutputTarget, APipeIsWrittenInPlaceAndSafetensorsRefuseIt) {
  TestDir dir;
  const std::string fifo = dir.file("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = slurp(fifo); });
  write_file_atomic(fifo, std::string_view("through the pipe"));
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the pipe was replaced";
  // A pipe behind a /proc/self/fd link (what /dev/stdout is in `resnet eval --predictions
  // /dev/stdout | head`): the link reads "pipe:[N]", no path to follow; the kernel's open is.
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  write_file_atomic("/proc/self/fd/" + std::to_string(ends[1]), std::string_view("via fd"));
  ::close(ends[1]);
  char buf[16] = {};
  EXPECT_EQ(::read(ends[0], buf, sizeof buf - 1), 6);
  EXPECT_EQ(std::string(buf), "via fd");
  ::close(ends[0]);
  // A device: /dev/null takes the bytes and stays a device.
  write_file_atomic("/dev/null", std::string_view("discarded"));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));

  HostTensor t({1}, DType::f32);
  try {
    write_safetensors(fifo, {{"w", t.view()}});
    ADD_FAILURE() << "a safetensors file went to a pipe";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a device, a pipe or a socket, not a file"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace rn

#include "train/checkpoint_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "core/check.h"
#include "test_dir.h"

namespace rn {
namespace {

int files_in(const std::filesystem::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(CheckpointFile, WriteThenRead) {
  TestDir dir;
  const std::string path = dir.file("a.bin");
  const std::string bytes("head\0tail", 9);
  write_file_atomic(path, bytes);
  EXPECT_EQ(read_text_file(path), bytes);
  std::vector<uint8_t> raw = read_file(path);
  ASSERT_EQ(raw.size(), 9u);
  EXPECT_EQ(raw[4], 0);
  EXPECT_EQ(files_in(dir.path()), 1);  // no temporary left behind

  write_file_atomic(path, std::string_view("replaced"));
  EXPECT_EQ(read_text_file(path), "replaced");
  write_file_atomic(path, std::string_view());
  EXPECT_EQ(read_text_file(path), "");
  EXPECT_EQ(files_in(dir.path()), 1);
}

TEST(CheckpointFile, StreamedWrite) {
  TestDir dir;
  const std::string path = dir.file("big.bin");
  std::vector<float> chunk(100000, 1.25f);
  write_file_atomic(path, [&](AtomicFileWriter& w) {
    for (int i = 0; i < 3; ++i) w.write(chunk.data(), chunk.size() * sizeof(float));
    EXPECT_EQ(w.bytes_written(), 3 * chunk.size() * sizeof(float));
  });
  EXPECT_EQ(std::filesystem::file_size(path), 3 * chunk.size() * sizeof(float));
}

TEST(CheckpointFile, FailedWriteLeavesOldFileIntact) {
  TestDir dir;
  const std::string path = dir.file("ckpt.bin");
  write_file_atomic(path, std::string_view("old contents"));
  // The writer fails halfway (as a serializer would on a bad tensor, or the disk when full).
  EXPECT_THROW(write_file_atomic(path,
                                 [](AtomicFileWriter& w) {
                                   w.write(std::string_view("new partial"));
                                   throw std::runtime_error("disk full");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_text_file(path), "old contents");
  EXPECT_EQ(files_in(dir.path()), 1);  // the temporary file was removed
}

TEST(CheckpointFile, RenameFailureNamesPathAndCleansUp) {
  TestDir dir;
  const std::string path = dir.file("is_a_folder");
  std::filesystem::create_directories(std::filesystem::path(path) / "inside");
  try {
    write_file_atomic(path, std::string_view("x"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Is a directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(files_in(dir.path()), 1);
  EXPECT_TRUE(std::filesystem::is_directory(std::filesystem::path(path) / "inside"));
}

TEST(CheckpointFile, MissingFolderAndMissingFile) {
  TestDir dir;
  const std::string path = dir.file("no/such/folder/x.bin");
  try {
    write_file_atomic(path, std::string_view("x"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  try {
    read_file(dir.file("missing.bin"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_file(dir.path().string()), Error);  // a folder
}

}  // namespace
}  // namespace rn

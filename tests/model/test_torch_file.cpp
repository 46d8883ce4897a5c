// The torch.save reader (model/torch_file.h): files written by Debian's PyTorch
// (tests/model/make_torch_files.py) in the zip and the legacy containers, with pickle
// protocols 2 and 4, read back tensor for tensor, byte for byte, as PyTorch itself gives
// them: every dtype, views with strides and offsets, empty and 0-d tensors, parameters, and a
// training script's checkpoint with the weights under "state_dict". Damaged, foreign and
// refused files give errors that name the file and the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/torch_file.h"
#include "python_for_tests.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

using test::python;

std::vector<std::byte> read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

void write_all(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class TorchFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One folder per process: ctest runs each test as its own process, several at once.
    dir_ = fs::path(RN_BINARY_DIR) / "test_runs" / "torch_file" / std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string cmd = python() + " " + RN_SOURCE_DIR + "/tests/model/make_torch_files.py " + dir_.string() +
                            " > " + (dir_ / "make.log").string() + " 2>&1";
    made_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!made_) GTEST_SKIP() << "torch not importable by " << python() << " (python3-torch): see " << dir_ / "make.log";
  }
  static fs::path file(const std::string& name) { return dir_ / name; }

  static void expect_as_torch_reads(const std::string& name, const TorchStateDict& sd) {
    std::ifstream f(dir_ / (name + ".expect.json"));
    const nlohmann::json expected = nlohmann::json::parse(f);
    ASSERT_EQ(sd.tensors.size(), expected.size()) << name;
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& e = expected[i];
      const auto& [tname, t] = sd.tensors[i];
      SCOPED_TRACE(name + ": " + tname);
      EXPECT_EQ(tname, e["name"].get<std::string>());
      EXPECT_EQ(t.dtype, e["dtype"].get<std::string>());
      EXPECT_EQ(t.shape, e["shape"].get<std::vector<int64_t>>());
      const std::vector<std::byte> bytes = read_all(dir_ / "expect" / e["file"].get<std::string>());
      EXPECT_EQ(t.data.size(), bytes.size());
      EXPECT_TRUE(t.data == bytes) << "the bytes differ from PyTorch's";
    }
    EXPECT_TRUE(sd.other_entries.empty());
  }

  static inline fs::path dir_;
  static inline bool made_ = false;
};

TEST_F(TorchFile, ZipFormatReadsEveryTensorAsPyTorchDoes) {
  const TorchStateDict sd = read_torch_state_dict(file("zip.pth").string());
  EXPECT_EQ(sd.format, "zip");
  EXPECT_EQ(sd.key, "");
  expect_as_torch_reads("zip", sd);
}

TEST_F(TorchFile, LegacyFormatReadsEveryTensorAsPyTorchDoes) {
  const TorchStateDict sd = read_torch_state_dict(file("legacy.pth").string());
  EXPECT_EQ(sd.format, "legacy");
  expect_as_torch_reads("legacy", sd);
}

TEST_F(TorchFile, PickleProtocol4ReadsTheSame) {
  for (const char* name : {"protocol4", "legacy4"}) {
    const TorchStateDict sd = read_torch_state_dict(file(std::string(name) + ".pth").string());
    expect_as_torch_reads(name, sd);
  }
}

TEST_F(TorchFile, EveryContainerIsRecognisedByItsFirstBytes) {
  for (const char* name : {"zip.pth", "legacy.pth", "protocol4.pth", "legacy4.pth", "checkpoint.pth"})
    EXPECT_TRUE(looks_like_torch_file(read_all(file(name)))) << name;
}

TEST_F(TorchFile, CheckpointFindsTheStateDictUnderItsKey) {
  const TorchStateDict sd = read_torch_state_dict(file("checkpoint.pth").string());
  EXPECT_EQ(sd.key, "state_dict");
  expect_as_torch_reads("checkpoint", sd);
}

TEST_F(TorchFile, PickledModuleIsRefusedByName) {
  const std::string e = error_of([&] { read_torch_state_dict(file("module.pth").string()); });
  EXPECT_NE(e.find("module.pth"), std::string::npos) << e;
  EXPECT_NE(e.find("torch.nn.modules.container.Sequential"), std::string::npos) << e;
  EXPECT_NE(e.find("state_dict()"), std::string::npos) << e;
}

TEST_F(TorchFile, DictWithoutTensorsListsItsKeys) {
  const std::string e = error_of([&] { read_torch_state_dict(file("no_tensors.pth").string()); });
  EXPECT_NE(e.find("no tensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'epoch', 'note'"), std::string::npos) << e;
}

TEST_F(TorchFile, DamagedStorageFailsTheZipChecksum) {
  std::vector<std::byte> b = read_all(file("zip.pth"));
  // The first storage's bytes (conv.weight, 432 of them) follow data.pkl; flip one in their middle.
  const std::string marker = "zip/data/0";
  auto it = std::search(b.begin(), b.end(), reinterpret_cast<const std::byte*>(marker.data()),
                        reinterpret_cast<const std::byte*>(marker.data() + marker.size()));
  ASSERT_NE(it, b.end());
  const size_t at = static_cast<size_t>(it - b.begin()) + marker.size() + 200;  // inside the record's data
  b[at] ^= std::byte{0x40};
  write_all(file("damaged.pth"), b);
  const std::string e = error_of([&] { read_torch_state_dict(file("damaged.pth").string()); });
  EXPECT_NE(e.find("damaged.pth"), std::string::npos) << e;
  EXPECT_NE(e.find("zip/data/0"), std::string::npos) << e;
}

TEST_F(TorchFile, EveryTruncationIsAnErrorNotACrash) {
  for (const char* name : {"zip.pth", "legacy.pth"}) {
    const std::vector<std::byte> b = read_all(file(name));
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{4}, size_t{30}, b.size() / 3, b.size() / 2, b.size() - 8, b.size() - 1}) {
      SCOPED_TRACE(std::string(name) + " cut to " + std::to_string(n));
      const std::string e = error_of([&] { parse_torch_state_dict(std::span(b.data(), n), "cut.pth"); });
      EXPECT_NE(e.find("PyTorch file 'cut.pth'"), std::string::npos) << e;
      // A zip whose end is cut off is named as truncated, not as "not a zip archive".
      if (std::string(name) == "zip.pth" && n >= b.size() / 2)
        EXPECT_NE(e.find("truncated or damaged: it begins as a zip archive but its end"), std::string::npos) << e;
    }
  }
}

TEST(TorchFileBytes, ForeignBytesAreNamed) {
  const std::string text = "not a model\n";
  std::vector<std::byte> b(text.size());
  std::memcpy(b.data(), text.data(), text.size());
  const std::string e = error_of([&] { parse_torch_state_dict(b, "notes.txt"); });
  EXPECT_NE(e.find("'notes.txt': neither a zip archive nor a pickle"), std::string::npos) << e;
  EXPECT_FALSE(looks_like_torch_file(b));
}

TEST(TorchFileBytes, OpcodesOutsideTorchSaveAreRefused) {
  // PROTO 2, then INST (protocol 0's way of calling a class), which torch.save never writes.
  const unsigned char raw[] = {0x80, 0x02, 'i', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', '.'};
  std::vector<std::byte> b(sizeof(raw));
  std::memcpy(b.data(), raw, sizeof(raw));
  const std::string e = error_of([&] { parse_torch_state_dict(b, "evil.pth"); });
  EXPECT_NE(e.find("opcode 0x69"), std::string::npos) << e;
}

TEST(TorchFileBytes, MissingFileIsNamed) {
  const std::string e = error_of([] { read_torch_state_dict("/nonexistent/resnet50.pth"); });
  EXPECT_NE(e.find("'/nonexistent/resnet50.pth': cannot open it"), std::string::npos) << e;
}

}  // namespace
}  // namespace rn

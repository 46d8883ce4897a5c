// The build's identity (core/build_info.h) and the library versions (train/versions.h): they
// describe this source tree and these libraries, and every run records them.
#include "train/versions.h"

#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <oneapi/dnnl/dnnl.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_info.h"
#include "core/memory_space.h"
#include "dist/nccl_communicator.h"
#include "log_capture.h"
#include "model/safetensors.h"
#include "ops/backend.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The command's stdout and its exit status.
std::pair<std::string, int> run(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return {"", -1};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

std::string version_of(const std::vector<LibraryVersion>& libs, const std::string& name) {
  for (const LibraryVersion& l : libs)
    if (l.name == name) return l.version;
  return "<" + name + " not listed>";
}

TEST(BuildInfo, DescribesThisSourceTree) {
  const BuildInfo& b = build_info();
  // The version is the project's (CMakeLists.txt).
  const std::string cmake = read_text(fs::path(RN_SOURCE_DIR) / "CMakeLists.txt");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(cmake, m, std::regex(R"(project\(resnet_cpp VERSION ([0-9.]+))")));
  EXPECT_EQ(b.version, m[1].str());
  // The commit is the tree's HEAD (the build regenerates it; tests run on what was just built).
  const auto [head, rc] = run("git -C '" RN_SOURCE_DIR "' rev-parse --short=12 HEAD");
  if (rc == 0 && !head.empty())
    EXPECT_EQ(b.commit, head);
  else
    EXPECT_EQ(b.commit, "unknown");
  EXPECT_FALSE(b.compiler.empty());
  const std::string d = build_description();
  EXPECT_EQ(d.rfind("resnet.cpp " + std::string(b.version) + " (commit " + std::string(b.commit), 0), 0u) << d;
  EXPECT_EQ(d.find("+modified") != std::string::npos, b.modified) << d;
  EXPECT_NE(d.find(std::string(b.compiler)), std::string::npos) << d;
}

// cmake/build_info.cmake on a scratch git tree: the commit, the modified mark (tracked files
// only), and "unknown" outside a git tree.
TEST(BuildInfo, GeneratorFollowsTheTree) {
  if (run("git --version").second != 0) GTEST_SKIP() << "git is not installed";
  TestDir dir;
  const fs::path src = dir.path() / "src";
  fs::create_directories(src / "cmake");
  fs::copy_file(fs::path(RN_SOURCE_DIR) / "cmake/build_info.cpp.in", src / "cmake/build_info.cpp.in");
  std::ofstream(src / "tracked.txt") << "one\n";
  const std::string git = "git -C '" + src.string() + "' -c user.name=t -c user.email=t@example.com ";
  ASSERT_EQ(run(git + "init -q").second, 0);
  ASSERT_EQ(run(git + "add -A").second, 0);
  ASSERT_EQ(run(git + "commit -q -m one").second, 0);
  const std::string head = run(git + "rev-parse --short=12 HEAD").first;
  ASSERT_EQ(head.size(), 12u);
  const fs::path out = dir.path() / "build_info.cpp";
  auto generate = [&](const fs::path& source) {
    const std::string cmd = std::string("'") + RN_CMAKE_COMMAND + "' -DSOURCE_DIR='" + source.string() + "' -DOUT='" +
                            out.string() +
                            "' -DVERSION=9.8.7 -DBUILD_TYPE=Release '-DCOMPILER=GNU 1.2' -DSANITIZE=OFF" + " -P '" +
                            RN_SOURCE_DIR + "/cmake/build_info.cmake'";
    EXPECT_EQ(run(cmd).second, 0) << cmd;
    return read_text(out);
  };
  std::string text = generate(src);
  EXPECT_NE(text.find("{\"9.8.7\", \"" + head + "\", false, \"Release\", \"GNU 1.2\","), std::string::npos) << text;
  std::ofstream(src / "untracked.txt") << "new\n";  // untracked: not a modification
  text = generate(src);
  EXPECT_NE(text.find("\"" + head + "\", false,"), std::string::npos) << text;
  std::ofstream(src / "tracked.txt") << "two\n";
  text = generate(src);
  EXPECT_NE(text.find("\"" + head + "\", true,"), std::string::npos) << text;
  // A tree without git (a tarball), and one inside another repository, have no commit.
  const fs::path plain = dir.path() / "plain";
  fs::create_directories(plain / "cmake");
  fs::copy_file(fs::path(RN_SOURCE_DIR) / "cmake/build_info.cpp.in", plain / "cmake/build_info.cpp.in");
  text = generate(plain);
  EXPECT_NE(text.find("\"unknown\", false,"), std::string::npos) << text;
  const fs::path nested = src / "nested";
  fs::create_directories(nested / "cmake");
  fs::copy_file(fs::path(RN_SOURCE_DIR) / "cmake/build_info.cpp.in", nested / "cmake/build_info.cpp.in");
  text = generate(nested);
  EXPECT_NE(text.find("\"unknown\", false,"), std::string::npos) << text;
}

TEST(Versions, ListTheLibrariesInUse) {
  const std::vector<LibraryVersion> libs = library_versions();
  const dnnl_version_t* dnnl = dnnl_version();
  EXPECT_EQ(version_of(libs, "oneDNN"),
            std::to_string(dnnl->major) + "." + std::to_string(dnnl->minor) + "." + std::to_string(dnnl->patch));
  EXPECT_EQ(version_of(libs, "libpng"), png_get_libpng_ver(nullptr));
  EXPECT_TRUE(std::regex_match(version_of(libs, "libjpeg-turbo"), std::regex(R"(\d+\.\d+\.\d+)")))
      << version_of(libs, "libjpeg-turbo");
  // Debian's Open MPI names itself "Open MPI v4.1.4, ..." -> {"Open MPI", "4.1.4"}.
  EXPECT_TRUE(std::regex_match(version_of(libs, "Open MPI"), std::regex(R"(\d+\.\d+\.\d+)")))
      << describe_libraries(libs);
  const std::vector<std::string> backends = available_backends();
  const bool cuda = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  for (const char* name : {"CUDA runtime", "CUDA driver", "cuDNN", "cuBLAS"}) {
    const std::string v = version_of(libs, name);
    if (!cuda) {
      EXPECT_EQ(v, std::string("<") + name + " not listed>");
      continue;
    }
    // "none" for the driver of a machine without a GPU; digits otherwise.
    EXPECT_TRUE(std::regex_match(v, std::regex(R"(\d+\.\d+(\.\d+)?)")) ||
                (std::string(name) == "CUDA driver" && v == "none"))
        << name << " " << v;
  }
  if (nccl_available()) {
    EXPECT_TRUE(std::regex_match(version_of(libs, "NCCL"), std::regex(R"(\d+\.\d+\.\d+)"))) << version_of(libs, "NCCL");
  }
  const std::string line = software_description();
  EXPECT_EQ(line, build_description() + "; " + describe_libraries(libs));
  EXPECT_EQ(describe_libraries({{"a", "1"}, {"b c", "2.0"}}), "a 1, b c 2.0");
}

std::vector<nlohmann::json> starts_of(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (const auto& r : read_metrics(run_dir + "/metrics.jsonl"))
    if (r.value("kind", "") == "start") out.push_back(r);
  return out;
}

// A run records its build in train.log, metrics.jsonl, its checkpoints and its report; a resume
// from a checkpoint of another build says so.
TEST(Versions, RunsRecordTheirBuild) {
  TestDir dir;
  const Config cfg = test::small_run_config(dir.file("run"));
  const TrainResult a = test::train_until(cfg, 4);
  ASSERT_EQ(a.steps, 4);
  const std::string log = read_text(a.run_dir + "/train.log");
  EXPECT_NE(log.find(software_description()), std::string::npos) << log;
  std::vector<nlohmann::json> starts = starts_of(a.run_dir);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].at("software"), build_description());
  EXPECT_EQ(starts[0].at("libraries"), describe_libraries(library_versions()));
  EXPECT_EQ(starts[0].at("resumed"), false);
  // The pages host memory comes in moves the step's speed by several percent: said and recorded.
  EXPECT_EQ(starts[0].at("host_memory"), host_memory_description());
  EXPECT_NE(log.find("host memory: " + host_memory_description()), std::string::npos) << log;
  const fs::path ckpt = fs::path(a.run_dir) / "checkpoints/step-00000004.safetensors";
  ASSERT_TRUE(fs::exists(ckpt));
  EXPECT_EQ(SafetensorsFile::load(ckpt.string()).metadata().at("resnet_cpp.build"), build_description());
  EXPECT_NE(read_text(a.run_dir + "/report.html").find(build_description()), std::string::npos);

  // Resumed by the same build: no warning.
  TrainOptions second;
  second.resume_dir = a.run_dir;
  second.max_steps = 8;
  {
    LogCapture capture;
    ASSERT_EQ(train(cfg, second).steps, 8);
    EXPECT_EQ(capture.text().find("the checkpoint was written by"), std::string::npos) << capture.text();
  }
  // The newest checkpoint as another build would have written it: the same length of text, so
  // the header keeps its size.
  const fs::path newest = fs::path(a.run_dir) / "checkpoints/step-00000008.safetensors";
  std::string bytes = read_text(newest);
  const std::string ours = build_description(), other = "resnet.old" + ours.substr(std::string("resnet.cpp").size());
  const size_t at = bytes.find(ours);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, ours.size(), other);
  ASSERT_TRUE(reseal_header_crc(bytes));  // an edit on purpose, not damage
  std::ofstream(newest, std::ios::binary | std::ios::trunc) << bytes;
  TrainOptions third;
  third.resume_dir = a.run_dir;
  {
    LogCapture capture;
    ASSERT_EQ(train(cfg, third).steps, 12);
    EXPECT_NE(capture.text().find("the checkpoint was written by " + other + ", and this is " + ours),
              std::string::npos)
        << capture.text();
  }
  starts = starts_of(a.run_dir);
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[1].at("step"), 4);
  EXPECT_EQ(starts[1].at("resumed"), true);
  EXPECT_EQ(starts[2].at("step"), 8);
  // One build ran every stretch (the edited file only claimed another), so the report names it once.
  const std::string report = read_text(a.run_dir + "/report.html");
  EXPECT_NE(report.find(build_description()), std::string::npos);
  EXPECT_EQ(report.find("; then "), std::string::npos);
}

}  // namespace
}  // namespace rn

// `resnet info` memory per level and `resnet bench --find-max-batch --memory-cap`, run as
// the real binary on a small model.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace rn {
namespace {

struct Output {
  int status = -1;
  std::string text;  // stdout and stderr
};

Output run_resnet(const std::string& args) {
  const std::string cmd = std::string(RN_BINARY_DIR) + "/resnet " + args + " 2>&1";
  Output out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.text.append(buf, n);
  const int status = pclose(p);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

const std::string kSmall = "--model resnet20 --input 1x16x16 --classes 10";

TEST(ResnetInfo, PlansEveryMemoryLevel) {
  const Output o = run_resnet("info " + kSmall + " --batch 16");
  ASSERT_EQ(o.status, 0) << o.text;
  for (const char* col : {"arena", "activations", "gradients", "params", "optimizer", "workspace", "total"})
    EXPECT_NE(o.text.find(col), std::string::npos) << col << "\n" << o.text;
  for (const char* level : {"\n  O0 ", "\n  O1 ", "\n  O2 "})
    EXPECT_NE(o.text.find(level), std::string::npos) << o.text;
}

TEST(ResnetBench, FindMaxBatchFitsMoreAtEachLevel) {
  const size_t cap = 12u << 20;
  const Output o =
      run_resnet("bench " + kSmall + " --threads 2 --find-max-batch --memory-cap 12MiB --steps 1 --warmup 0 --json");
  ASSERT_EQ(o.status, 0) << o.text;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(o.text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u) << o.text;
  int64_t batch[3];
  for (int i = 0; i < 3; ++i) {
    const char* const levels[] = {"O0", "O1", "O2"};  // not "O" + to_string(i): GCC 12 -Wrestrict false positive
    EXPECT_EQ(rows[i].at("memory_level").get<std::string>(), levels[i]);
    batch[i] = rows[i].at("batch").get<int64_t>();
    EXPECT_LE(rows[i].at("planned_total").get<size_t>(), cap) << rows[i];
    EXPECT_GT(rows[i].at("median_step_s").get<double>(), 0.0);
    // The measured high-water mark of the arena is the planned one (page granularity).
    EXPECT_GE(rows[i].at("arena_high_water").get<size_t>() + 4096, rows[i].at("planned_arena").get<size_t>());
  }
  EXPECT_LT(batch[0], batch[1]);
  EXPECT_LT(batch[1], batch[2]);
}

TEST(ResnetBench, BadMemoryArgumentsAreClearErrors) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"--find-max-batch --memory-cap 1MiB", "too small for batch 1"},
      {"--find-max-batch --memory-cap 12X", "not a positive byte count"},
      {"--find-max-batch", "needs --memory-cap"},
      {"--memory-level O5", "unknown memory level 'O5' (expected O0, O1 or O2)"},
  };
  for (const Case& c : cases) {
    const Output o = run_resnet("bench " + kSmall + " " + c.args);
    EXPECT_NE(o.status, 0) << c.args;
    EXPECT_NE(o.text.find(c.message), std::string::npos) << c.args << ":\n" << o.text;
  }
}

}  // namespace
}  // namespace rn

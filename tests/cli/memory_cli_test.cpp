// `resnet info` memory per level and `resnet bench --find-max-batch --memory-cap`, run as
// the real binary on a small model.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace rn {
namespace {

struct Output {
  int status = -1;
  std::string text;  // stdout and stderr (stdout alone with stdout_only)
};

Output run_resnet(const std::string& args, bool stdout_only = false) {
  const std::string cmd = std::string(RN_BINARY_DIR) + "/resnet " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
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

// Without --input and --classes a model is shown as it is made: the CIFAR ResNets at 3x32x32
// with 10 classes, the ImageNet ones at 3x224x224 with 1000; what is given wins.
TEST(ResnetInfo, AModelWithoutInputOrClassesIsShownAsItIsMade) {
  Output o = run_resnet("info --model resnet56 --device none");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("input            3x32x32, 10 classes"), std::string::npos) << o.text;
  o = run_resnet("info --model resnet50_gdw --device none");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("input            3x224x224, 1000 classes"), std::string::npos) << o.text;
  o = run_resnet("info --model resnet20 --classes 100 --device none");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("input            3x32x32, 100 classes"), std::string::npos) << o.text;
  o = run_resnet("info --model resnet18 --input 1x64x64 --device none");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("input            1x64x64, 1000 classes"), std::string::npos) << o.text;
  o = run_resnet("info --model resnet20 --classes 0");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("--classes"), std::string::npos) << o.text;
}

// `resnet info` plans without allocating, so a batch far beyond this machine's memory is
// reported, not refused (resnet50 at batch 512 plans about 97 GiB at O0).
TEST(ResnetInfo, PlansBatchesThatDoNotFitThisMachine) {
  const Output o = run_resnet("info --model resnet50 --batch 512");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("GiB"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("out of host memory"), std::string::npos) << o.text;
}

// The arena of memory level `level` ("O0", ...) in the table `resnet info` prints, in bytes.
double info_arena(const std::string& text, const std::string& level) {
  std::smatch m;
  const std::regex row("\n  " + level + R"(\s+([0-9.]+) (B|KiB|MiB|GiB))");
  if (!std::regex_search(text, m, row)) return -1;
  const std::string unit = m[2];
  const double scale = unit == "B" ? 1 : unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0 : 1073741824.0;
  return std::stod(m[1]) * scale;
}

// --dtype bf16 plans precision O2 (bf16 activations: a smaller arena than fp32's at every
// memory level), --precision O1 the bf16 convolutions between fp32 activations (whose bf16
// copies come on top of fp32's).
TEST(ResnetInfo, HalfDtypePlansTheRequestedPrecisionLevel) {
  const std::string base = "info " + kSmall + " --batch 16 --device none";
  const Output fp32 = run_resnet(base), o2 = run_resnet(base + " --dtype bf16"),
               o1 = run_resnet(base + " --dtype bf16 --precision O1");
  for (const Output* o : {&fp32, &o2, &o1}) ASSERT_EQ(o->status, 0) << o->text;
  EXPECT_NE(fp32.text.find("precision O0 (fp32)"), std::string::npos) << fp32.text;
  EXPECT_NE(o2.text.find("precision O2 (bf16 convolutions, bf16 activations)"), std::string::npos) << o2.text;
  EXPECT_NE(o1.text.find("precision O1 (bf16 convolutions, fp32 activations)"), std::string::npos) << o1.text;
  // --precision O1-O3 alone plans bf16, as the docs' examples write it.
  const Output o1_alone = run_resnet(base + " --precision O1");
  ASSERT_EQ(o1_alone.status, 0) << o1_alone.text;
  EXPECT_NE(o1_alone.text.find("precision O1 (bf16 convolutions, fp32 activations)"), std::string::npos)
      << o1_alone.text;
  for (const char* level : {"O0", "O1", "O2"}) {
    const double a32 = info_arena(fp32.text, level), a2 = info_arena(o2.text, level), a1 = info_arena(o1.text, level);
    ASSERT_GT(a32, 0) << level << "\n" << fp32.text;
    EXPECT_LT(a2, 0.6 * a32) << "memory " << level << ": bf16 activations\n" << o2.text;
    EXPECT_GT(a1, a2) << "memory " << level << ": O1 keeps fp32 activations\n" << o1.text;
  }
  struct Case {
    std::string args, message;
  } bad[] = {
      {"--dtype bf16 --precision O0", "O0 is fp32 everywhere"},
      {"--precision O5", "unknown precision level 'O5' (expected O0, O1, O2, O3)"},
      {"--dtype fp32 --precision O2", "--precision O2 with --dtype fp32: name the half dtype"},
      // A storage dtype is refused before anything is printed (it planned O2 "int32
      // convolutions" and failed half-way through the report).
      {"--dtype int32", "--dtype must be fp32, bf16 or fp16, got 'int32'"},
  };
  for (const Case& c : bad) {
    const Output o = run_resnet(base + " " + c.args);
    EXPECT_EQ(o.text.find("parameters"), std::string::npos) << c.args << ": half a report\n" << o.text;
    EXPECT_NE(o.status, 0) << c.args;
    EXPECT_NE(o.text.find(c.message), std::string::npos) << c.args << ":\n" << o.text;
  }
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

// Large host blocks come in transparent huge pages unless RN_HUGE_PAGES=0; the JSON line
// says which (the page size, 0 for none), since it moves the step's speed by several percent.
TEST(ResnetBench, HugePagesAreReportedAndCanBeTurnedOff) {
  size_t host_huge = 0;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
    if (std::fscanf(f, "%zu", &host_huge) != 1) host_huge = 0;
    std::fclose(f);
  }
  const std::string args = "bench " + kSmall + " --batch 4 --steps 1 --warmup 0 --json";
  auto huge_page_bytes = [&](const char* env) -> size_t {
    if (env) ::setenv("RN_HUGE_PAGES", env, 1);
    const Output o = run_resnet(args, true);
    ::unsetenv("RN_HUGE_PAGES");
    EXPECT_EQ(o.status, 0) << o.text;
    const size_t at = o.text.find('{');
    if (o.status != 0 || at == std::string::npos) return SIZE_MAX;
    return nlohmann::json::parse(o.text.substr(at)).at("host_huge_page_bytes").get<size_t>();
  };
  EXPECT_EQ(huge_page_bytes(nullptr), host_huge);
  EXPECT_EQ(huge_page_bytes("1"), host_huge);
  EXPECT_EQ(huge_page_bytes("0"), 0u);
  ::setenv("RN_HUGE_PAGES", "yes", 1);
  const Output bad = run_resnet(args);
  ::unsetenv("RN_HUGE_PAGES");
  EXPECT_NE(bad.status, 0) << bad.text;
  EXPECT_NE(bad.text.find("RN_HUGE_PAGES=yes: expected 0"), std::string::npos) << bad.text;
}

TEST(ResnetBench, BadMemoryArgumentsAreClearErrors) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"--find-max-batch --memory-cap 1MiB", "too small for batch 1"},
      {"--find-max-batch --memory-cap 12X", "not a positive byte count"},
      // Beyond 2^63 bytes: the conversion gave 0 ("too small for batch 1").
      {"--find-max-batch --memory-cap 1e30", "--memory-cap: '1e30' is more bytes than any memory or file holds"},
      {"--half int32", "--half must be bf16 or fp16, got 'int32'"},
      {"--find-max-batch", "needs --memory-cap"},
      {"--memory-level O5", "unknown memory level 'O5' (expected O0, O1 or O2)"},
      {"--batch 0", "--batch: must be > 0, got 0"},  // not CLI11's "not in range 0.000000 to 1797..."
      {"--batch x", "--batch: expected a number, got 'x'"},
      {"--threads -3", "--threads: must be >= 0, got -3"},
  };
  for (const Case& c : cases) {
    const Output o = run_resnet("bench " + kSmall + " " + c.args);
    EXPECT_NE(o.status, 0) << c.args;
    EXPECT_NE(o.text.find(c.message), std::string::npos) << c.args << ":\n" << o.text;
  }
}

// --profile averages the timed steps only: the warmup steps (first-touch of the arena, the
// first call of each kernel) are left out, as they are from the step times.
TEST(ResnetBench, ProfileLeavesTheWarmupStepsOut) {
  const Output o = run_resnet("bench " + kSmall + " --batch 4 --steps 2 --warmup 3 --profile");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("mean over 2 runs"), std::string::npos) << o.text;
}

// --json: stdout is one JSON line, --profile's table included (it goes to stderr).
TEST(ResnetBench, JsonWithProfileKeepsStdoutOneJsonLine) {
  const Output o = run_resnet("bench " + kSmall + " --batch 4 --steps 1 --warmup 0 --profile --json", true);
  ASSERT_EQ(o.status, 0) << o.text;
  ASSERT_FALSE(o.text.empty());
  EXPECT_EQ(o.text.find('\n'), o.text.size() - 1) << "one line:\n" << o.text;
  const auto j = nlohmann::json::parse(o.text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << o.text;
  EXPECT_TRUE(j.contains("images_per_sec")) << o.text;
  EXPECT_NE(run_resnet("bench " + kSmall + " --batch 4 --steps 1 --warmup 0 --profile --json")
                .text.find("plan steps by time"),
            std::string::npos)
      << "the table, on stderr";
}

}  // namespace
}  // namespace rn

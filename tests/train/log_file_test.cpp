// The logger's outputs (core/log.h): a run's train.log receives every message while it is
// open and none after, and outputs come and go while other threads log (a data-parallel
// run's communication thread starts before train.log opens and outlives it).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "log_capture.h"
#include "test_dir.h"

namespace rn {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(LogFile, ReceivesMessagesWhileOpenAndNoneAfter) {
  TestDir dir;
  const auto path = dir.path() / "train.log";
  RN_LOG_INFO("before the file");
  {
    LogFile f;
    f.open(path.string());
    RN_LOG_INFO("while open {}", 1);
    RN_LOG_DEBUG("below the level");
  }
  RN_LOG_INFO("after the file");
  const std::string text = read_all(path);
  EXPECT_EQ(text.find("before the file"), std::string::npos) << text;
  EXPECT_NE(text.find("while open 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("below the level"), std::string::npos) << text;
  EXPECT_EQ(text.find("after the file"), std::string::npos) << text;
}

TEST(LogFile, ErrorsOnlyFileTakesErrorsWithItsLabel) {
  TestDir dir;
  const auto path = dir.path() / "train.log";
  {
    LogFile f;
    f.open_for_errors(path.string(), "[rank 1]");
    RN_LOG_WARN("a warning");
    RN_LOG_ERROR("an error");
  }
  const std::string text = read_all(path);
  EXPECT_EQ(text.find("a warning"), std::string::npos) << text;
  EXPECT_NE(text.find("[rank 1] an error"), std::string::npos) << text;
}

// Outputs attached and detached on one thread while others log: every message reaches the
// capture that lives throughout, whole, and none is lost or torn by the changes. Before the
// outputs changed under the logger's lock, the list was reallocated under the loggers' feet
// (a use-after-free that ThreadSanitizer reported; here a crash or lost lines, by chance).
TEST(LogFile, OutputsComeAndGoWhileOtherThreadsLog) {
  TestDir dir;
  // The outputs there were (stderr) are set aside for the test: it logs many lines.
  struct SetAside {
    SetAside() {
      edit_log_outputs([&](std::vector<spdlog::sink_ptr>& o) { saved.swap(o); });
    }
    ~SetAside() {
      edit_log_outputs([&](std::vector<spdlog::sink_ptr>& o) { o.insert(o.begin(), saved.begin(), saved.end()); });
    }
    std::vector<spdlog::sink_ptr> saved;
  } quiet;
  LogCapture all;
  std::atomic<bool> done{false};
  constexpr int kThreads = 2;
  std::vector<std::thread> loggers;
  std::vector<int> sent(kThreads, 0);
  for (int t = 0; t < kThreads; ++t)
    loggers.emplace_back([&, t] {
      while (!done.load()) RN_LOG_INFO("churn thread {} message {}", t, sent[static_cast<size_t>(t)]++);
    });
  for (int i = 0; i < 3000; ++i) {
    LogFile f;
    f.open((dir.path() / ("run" + std::to_string(i % 4) + ".log")).string());
    LogCapture passing;
  }
  done = true;
  for (auto& th : loggers) th.join();
  const std::string text = all.text();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_GT(sent[static_cast<size_t>(t)], 0);
    const int last = sent[static_cast<size_t>(t)] - 1;
    EXPECT_NE(text.find(fmt::format("churn thread {} message {}\n", t, last)), std::string::npos) << "thread " << t;
    EXPECT_EQ(all.count(fmt::format("churn thread {} message ", t)), sent[static_cast<size_t>(t)]) << "thread " << t;
  }
}

}  // namespace
}  // namespace rn

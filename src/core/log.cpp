#include "core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

#include "core/check.h"

namespace rn {

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("resnet", sink);
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return instance;
}

void log_to_file(const std::string& path) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    logger()->sinks().push_back(sink);
  } catch (const spdlog::spdlog_ex& e) {
    RN_FAIL() << "cannot open log file '" << path << "': " << e.what();
  }
}

void set_log_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  RN_CHECK(l != spdlog::level::off || level == "off") << "unknown log level '" << level << "'";
  logger()->set_level(l);
}

}  // namespace rn

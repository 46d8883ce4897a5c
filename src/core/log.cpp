#include "core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>
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

namespace {
std::mutex& sinks_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

LogFile::~LogFile() {
  if (!sink_) return;
  std::lock_guard<std::mutex> lock(sinks_mutex());
  auto& sinks = logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
}

void LogFile::open(const std::string& path) { open_sink(path, "", spdlog::level::trace); }

void LogFile::open_for_errors(const std::string& path, const std::string& label) {
  open_sink(path, label + " ", spdlog::level::err);
}

void LogFile::open_sink(const std::string& path, const std::string& label, spdlog::level::level_enum level) {
  RN_CHECK(!sink_) << "log file '" << path << "': this LogFile is open already";
  std::lock_guard<std::mutex> lock(sinks_mutex());
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] " + label + "%v");
    sink->set_level(level);
    logger()->sinks().push_back(sink);
    sink_ = std::move(sink);
  } catch (const spdlog::spdlog_ex& e) {
    RN_FAIL() << "cannot open log file '" << path << "': " << e.what();
  }
}

void LogFile::write_error(std::string_view text) {
  if (!sink_) return;
  try {
    sink_->log(spdlog::details::log_msg(logger()->name(), spdlog::level::err, text));
    sink_->flush();
  } catch (const spdlog::spdlog_ex&) {
    // The file is the second copy of the error (a full disk may be what went wrong): the
    // caller still reports it.
  }
}

void set_log_level(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  RN_CHECK(l != spdlog::level::off || level == "off") << "unknown log level '" << level << "'";
  logger()->set_level(l);
}

}  // namespace rn

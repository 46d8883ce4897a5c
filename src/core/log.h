// Project logging over spdlog. One logger, "resnet"; a training run adds a file sink for
// its folder's train.log (LogFile). Use RN_LOG_INFO("fmt {}", x) etc.
#pragma once

#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rn {

std::shared_ptr<spdlog::logger> logger();
void set_log_level(const std::string& level);  // "debug", "info", "warn", "error"

// Where the logger's messages go (stderr first; a run's train.log; a test's capture). Never
// through logger()->sinks(): these change the outputs under the lock each message is written
// under, safe while other threads log.
void add_log_output(const spdlog::sink_ptr& s);
void remove_log_output(const spdlog::sink_ptr& s);
void edit_log_outputs(const std::function<void(std::vector<spdlog::sink_ptr>&)>& edit);

// A file that receives every message of the logger while this object lives (a run's
// train.log): attached by open(), detached by the destructor, so that a process that trains
// twice does not write its second run into the first run's log.
class LogFile {
 public:
  LogFile() = default;
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  ~LogFile();

  void open(const std::string& path);  // appends; throws rn::Error naming the path
  // Errors only, each line marked with `label` ("[rank 1]"), into a file that another process
  // writes (a data-parallel rank's into rank 0's train.log: every line one append).
  void open_for_errors(const std::string& path, const std::string& label);
  bool is_open() const { return sink_ != nullptr; }
  // The error that ends a run, into the file only: the console shows it from whoever
  // catches it, and without it the log would stop mid-startup with no reason given.
  void write_error(std::string_view text);

 private:
  void open_sink(const std::string& path, const std::string& label, spdlog::level::level_enum level);
  std::shared_ptr<spdlog::sinks::sink> sink_;
};

}  // namespace rn

#define RN_LOG_DEBUG(...) ::rn::logger()->debug(__VA_ARGS__)
#define RN_LOG_INFO(...) ::rn::logger()->info(__VA_ARGS__)
#define RN_LOG_WARN(...) ::rn::logger()->warn(__VA_ARGS__)
#define RN_LOG_ERROR(...) ::rn::logger()->error(__VA_ARGS__)

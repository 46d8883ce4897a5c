#include "core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

#include "core/check.h"

namespace rn {

namespace {

// The logger's one sink: it hands each message to the outputs (stderr, a run's train.log, a
// test's capture) under the lock it writes under, and the outputs change under that lock, so
// that a message from another thread (a data-parallel run's communication thread outlives
// train.log) never walks the list while it is reallocated.
class Outputs final : public spdlog::sinks::dist_sink_mt {
 public:
  void edit(const std::function<void(std::vector<spdlog::sink_ptr>&)>& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    f(sinks_);
  }
};

// The console's pattern is set on the console's sink, not through the logger: a logger's
// pattern goes to every output, and an output attached before the logger's first use (a
// train.log with its rank label, a test's capture) keeps its own.
const std::shared_ptr<Outputs>& outputs() {
  static const std::shared_ptr<Outputs> instance = [] {
    auto o = std::make_shared<Outputs>();
    auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    console->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    o->add_sink(console);
    return o;
  }();
  return instance;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("resnet", spdlog::sink_ptr(outputs()));
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return instance;
}

void add_log_output(const spdlog::sink_ptr& s) { outputs()->add_sink(s); }
void remove_log_output(const spdlog::sink_ptr& s) { outputs()->remove_sink(s); }
void edit_log_outputs(const std::function<void(std::vector<spdlog::sink_ptr>&)>& edit) { outputs()->edit(edit); }

LogFile::~LogFile() {
  if (sink_) remove_log_output(sink_);
}

void LogFile::open(const std::string& path) { open_sink(path, "", spdlog::level::trace); }

void LogFile::open_for_errors(const std::string& path, const std::string& label) {
  open_sink(path, label + " ", spdlog::level::err);
}

void LogFile::open_sink(const std::string& path, const std::string& label, spdlog::level::level_enum level) {
  RN_CHECK(!sink_) << "log file '" << path << "': this LogFile is open already";
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] " + label + "%v");
    sink->set_level(level);
    add_log_output(sink);
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

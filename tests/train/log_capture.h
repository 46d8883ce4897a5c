// Test helper: captures what the project logger prints while it lives.
#pragma once

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "core/log.h"

namespace rn {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    sink_->set_pattern("%v");
    add_log_output(sink_);
  }
  ~LogCapture() { remove_log_output(sink_); }
  std::string text() const { return stream_.str(); }
  // How many times `what` appears in what was captured.
  int count(const std::string& what) const {
    const std::string t = text();
    int n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace rn

// Project logging over spdlog. One logger, "resnet"; the CLI adds a file sink for
// the run folder's train.log. Use RN_LOG_INFO("fmt {}", x) etc.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace rn {

std::shared_ptr<spdlog::logger> logger();
// Adds a sink that writes every message to `path` (appending).
void log_to_file(const std::string& path);
void set_log_level(const std::string& level);  // "debug", "info", "warn", "error"

}  // namespace rn

#define RN_LOG_DEBUG(...) ::rn::logger()->debug(__VA_ARGS__)
#define RN_LOG_INFO(...) ::rn::logger()->info(__VA_ARGS__)
#define RN_LOG_WARN(...) ::rn::logger()->warn(__VA_ARGS__)
#define RN_LOG_ERROR(...) ::rn::logger()->error(__VA_ARGS__)

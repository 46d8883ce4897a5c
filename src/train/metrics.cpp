#include "train/metrics.h"

#include <fmt/format.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/log.h"
#include "core/plural.h"
#include "core/utf8.h"
#include "train/checkpoint_file.h"

namespace rn {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// MetricsRecord and MetricsLog

MetricsRecord::MetricsRecord(std::string kind, int64_t epoch, int64_t step) {
  RN_CHECK(!kind.empty()) << "a metrics record needs a kind";
  fields_["kind"] = std::move(kind);
  fields_["epoch"] = epoch;
  fields_["step"] = step;
}

void MetricsRecord::check_new_key(std::string_view key) const {
  RN_CHECK(!key.empty() && key != "time" && !fields_.contains(key))
      << "metrics field '" << key << "' is empty, reserved or already set in a '" << fields_["kind"].get<std::string>()
      << "' record";
}

std::string cut_torn_last_line(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  std::string text = read_text_file(path);
  if (!text.empty() && text.back() != '\n') {
    size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    RN_LOG_WARN("{}: cutting off a torn last line ({} bytes) left by an interrupted run", path, text.size() - keep);
    fs::resize_file(path, keep, ec);
    RN_CHECK(!ec) << "cannot truncate '" << path << "': " << ec.message();
    text.resize(keep);
  }
  return text;
}

namespace {

// Repairs an existing metrics file (cut_torn_last_line) and returns the last record's "time"
// so that a resumed run continues the clock.
double repair_and_last_time(const std::string& path) {
  const std::string text = cut_torn_last_line(path);
  // The last non-blank line.
  size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return 0;
  size_t begin = text.rfind('\n', end);
  begin = begin == std::string::npos ? 0 : begin + 1;
  nlohmann::json last = nlohmann::json::parse(text.substr(begin, end + 1 - begin), nullptr, /*allow_exceptions=*/false);
  if (last.is_object() && last.contains("time") && last["time"].is_number()) return last["time"].get<double>();
  return 0;
}

void add_extra(MetricsRecord& record, const std::map<std::string, double>& extra) {
  for (const auto& [key, value] : extra) record.add(key, value);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, bool write) : path_((fs::path(run_dir) / kFileName).string()) {
  start_ = std::chrono::steady_clock::now();
  if (!write) return;
  time_offset_ = repair_and_last_time(path_);
  file_ = std::fopen(path_.c_str(), "a");
  RN_CHECK(file_ != nullptr) << "cannot open '" << path_ << "' for appending: " << std::strerror(errno);
  start_ = std::chrono::steady_clock::now();
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

double MetricsLog::elapsed_seconds() const {
  return time_offset_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void MetricsLog::log_train(const TrainMetrics& m) {
  MetricsRecord r("train", m.epoch, m.step);
  r.add("loss", m.loss).add("lr", m.lr).add("loss_scale", m.loss_scale).add("images_per_sec", m.images_per_sec);
  r.add("data_wait_share", m.data_wait_share).add("skipped_steps", m.skipped_steps);
  add_extra(r, m.extra);
  append(r);
}

MetricsRecord& MetricsRecord::add_fields(const nlohmann::json& object) {
  RN_CHECK(object.is_object()) << "metrics fields must be a JSON object, got " << object.type_name();
  for (const auto& [key, value] : object.items()) {
    if (value.is_boolean()) {
      add(key, value.get<bool>());
    } else if (value.is_number_integer()) {
      add(key, value.get<int64_t>());
    } else if (value.is_number()) {
      add(key, value.get<double>());
    } else {
      RN_CHECK(value.is_string()) << "metrics field '" << key << "' is a " << value.type_name()
                                  << ", not a number, boolean or string";
      add(key, std::string_view(value.get_ref<const std::string&>()));
    }
  }
  return *this;
}

void MetricsLog::log_eval(const EvalMetrics& m) {
  MetricsRecord r("eval", m.epoch, m.step);
  r.add("loss", m.loss).add("top1", m.top1).add("top5", m.top5);
  add_extra(r, m.extra);
  append(r);
}

void MetricsLog::append(const MetricsRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  nlohmann::ordered_json line = record.fields();
  line["time"] = std::round(elapsed_seconds() * 1000) / 1000;  // milliseconds are enough
  std::string text = line.dump() + "\n";                       // non-finite numbers become null
  size_t written = std::fwrite(text.data(), 1, text.size(), file_);
  RN_CHECK(written == text.size() && std::fflush(file_) == 0)
      << "cannot write to '" << path_ << "': " << std::strerror(errno);
}

std::vector<nlohmann::json> read_metrics(const std::string& path, bool skip_malformed) {
  const std::string text = read_text_file(path);
  std::vector<nlohmann::json> records;
  int64_t skipped = 0, first_skipped = 0;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t newline = text.find('\n', pos);
    const bool torn = newline == std::string::npos;  // only the last line can lack its newline
    std::string_view line(text.data() + pos, (torn ? text.size() : newline) - pos);
    pos = torn ? text.size() : newline + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;

    nlohmann::json record;
    std::string why;
    try {
      record = nlohmann::json::parse(line);
      if (!(record.is_object() && record.contains("kind") && record["kind"].is_string()))
        why = "not a JSON object with a string \"kind\"";
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range: a number too large
      if (torn) {
        RN_LOG_WARN("{}:{}: ignoring a torn last line (the run was interrupted while writing it)", path, line_no);
        break;
      }
      why = "not valid JSON: " + printable(e.what());
    }
    if (!why.empty()) {
      RN_CHECK(skip_malformed) << path << ":" << line_no << ": malformed metrics record (" << why
                               << "): " << std::string(line.substr(0, 80));
      if (skipped++ == 0) first_skipped = line_no;
      continue;
    }
    records.push_back(std::move(record));
  }
  if (skipped > 0)
    RN_LOG_WARN("{}: {} left out (the first at line {})", path, counted(skipped, "malformed line"), first_skipped);
  return records;
}

// ---------------------------------------------------------------------------------------------
// ProgressPrinter

struct ProgressPrinter::Screen {
  std::mutex mu;
  std::FILE* out = nullptr;
  std::string text;  // the bar, without control characters; empty: none
  bool shown = false;

  void erase_locked() {
    if (!shown) return;
    std::fputs("\r\033[K", out);
    std::fflush(out);
    shown = false;
  }
  void show_locked() {
    if (text.empty()) return;
    std::fputc('\r', out);
    std::fputs(text.c_str(), out);
    std::fputs("\033[K", out);  // clear what a longer previous bar left
    std::fflush(out);
    shown = true;
  }
};

namespace {

// Wraps the logger's stderr sink while a bar is on the same terminal: erases the bar,
// lets the message print, redraws the bar under it.
class ScreenAwareSink : public spdlog::sinks::sink {
 public:
  ScreenAwareSink(std::shared_ptr<spdlog::sinks::sink> inner, std::shared_ptr<ProgressPrinter::Screen> screen)
      : inner_(std::move(inner)), screen_(std::move(screen)) {}

  void log(const spdlog::details::log_msg& msg) override {
    if (!inner_->should_log(msg.level)) return;
    std::lock_guard<std::mutex> lock(screen_->mu);
    bool was_shown = screen_->shown;
    screen_->erase_locked();
    inner_->log(msg);
    if (was_shown) screen_->show_locked();
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

  const std::shared_ptr<spdlog::sinks::sink>& inner() const { return inner_; }
  const ProgressPrinter::Screen* screen() const { return screen_.get(); }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
  std::shared_ptr<ProgressPrinter::Screen> screen_;
};

bool writes_to_stderr(const std::shared_ptr<spdlog::sinks::sink>& s) {
  return std::dynamic_pointer_cast<spdlog::sinks::stderr_sink_mt>(s) ||
         std::dynamic_pointer_cast<spdlog::sinks::stderr_sink_st>(s) ||
         std::dynamic_pointer_cast<spdlog::sinks::stderr_color_sink_mt>(s) ||
         std::dynamic_pointer_cast<spdlog::sinks::stderr_color_sink_st>(s);
}

int terminal_columns(std::FILE* out) {
  struct winsize ws {};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

std::string progress_bar(double fraction, int width) {
  fraction = std::clamp(std::isfinite(fraction) ? fraction : 0.0, 0.0, 1.0);
  int filled = static_cast<int>(std::lround(fraction * width));
  std::string bar(static_cast<size_t>(width), ' ');
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled > 0 && filled < width) bar[static_cast<size_t>(filled - 1)] = '>';
  return "[" + bar + "]";
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 100 * 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

ProgressPrinter::ProgressPrinter(Mode mode, std::FILE* bar_out) : out_(bar_out), screen_(std::make_shared<Screen>()) {
  screen_->out = bar_out;
  if (mode == Mode::automatic) {
    const char* term = std::getenv("TERM");
    bar_ = bar_out != nullptr && ::isatty(::fileno(bar_out)) && !(term && std::string_view(term) == "dumb");
  } else {
    bar_ = mode == Mode::bar && bar_out != nullptr;
  }
  if (bar_ && bar_out == stderr) {
    edit_log_outputs([&](std::vector<spdlog::sink_ptr>& outputs) {
      for (auto& s : outputs) {
        if (!writes_to_stderr(s)) continue;
        s = std::make_shared<ScreenAwareSink>(s, screen_);
        wrapped_sinks_ = true;
      }
    });
  }
}

ProgressPrinter::~ProgressPrinter() {
  finish();
  if (!wrapped_sinks_) return;
  edit_log_outputs([&](std::vector<spdlog::sink_ptr>& outputs) {
    for (auto& s : outputs) {
      auto wrapper = std::dynamic_pointer_cast<ScreenAwareSink>(s);
      if (wrapper && wrapper->screen() == screen_.get()) s = wrapper->inner();
    }
  });
}

double ProgressPrinter::eta_seconds(const ProgressFields& f) const {
  if (!have_first_ || f.total_steps <= 0 || f.step <= first_step_) return -1;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_time_).count();
  double per_step = elapsed / static_cast<double>(f.step - first_step_);
  return per_step * static_cast<double>(std::max<int64_t>(0, f.total_steps - f.step));
}

void ProgressPrinter::update(const ProgressFields& f) {
  auto now = std::chrono::steady_clock::now();
  if (!have_first_) {
    have_first_ = true;
    first_step_ = f.step;
    first_time_ = now;
  }
  if (!bar_) return;
  bool epoch_end = f.steps_per_epoch > 0 && f.step_in_epoch >= f.steps_per_epoch;
  if (now - last_draw_ < std::chrono::milliseconds(100) && !epoch_end) return;
  last_draw_ = now;
  draw(f);
}

namespace {
// A loss to 4 decimals, or in 4 significant digits once it is absurd (a diverging run's 5e36
// would otherwise print 40 digits).
std::string loss_text(double loss) {
  return std::isfinite(loss) && std::abs(loss) >= 1e6 ? fmt::format("{:.4g}", loss) : fmt::format("{:.4f}", loss);
}
}  // namespace

void ProgressPrinter::draw(const ProgressFields& f) {
  double eta = eta_seconds(f);
  std::string left = fmt::format("epoch {}/{} ", f.epoch, f.epochs);
  std::string right = fmt::format(" {}/{} loss {} lr {:.4g} scale {:g} {:.0f} img/s wait {:.0f}%{}", f.step_in_epoch,
                                  f.steps_per_epoch, loss_text(f.loss), f.lr, f.loss_scale, f.images_per_sec,
                                  100 * f.data_wait_share, eta >= 0 ? " ETA " + format_duration(eta) : "");
  const int columns = terminal_columns(out_);
  int bar_width = std::min(30, columns - 1 - static_cast<int>(left.size() + right.size()) - 2);
  std::string text = left;
  if (bar_width >= 8) {
    double fraction = f.steps_per_epoch > 0 ? double(f.step_in_epoch) / double(f.steps_per_epoch) : 0;
    text += progress_bar(fraction, bar_width);
  }
  text += right;
  if (static_cast<int>(text.size()) > columns - 1) text.resize(static_cast<size_t>(std::max(columns - 1, 1)));

  std::lock_guard<std::mutex> lock(screen_->mu);
  screen_->text = std::move(text);
  screen_->show_locked();
}

void ProgressPrinter::log_line(const ProgressFields& f) {
  double eta = eta_seconds(f);
  RN_LOG_INFO("epoch {}/{} step {}/{} loss {} lr {:.4g} scale {:g} img/s {:.1f} data wait {:.1f}%{}", f.epoch, f.epochs,
              f.step_in_epoch, f.steps_per_epoch, loss_text(f.loss), f.lr, f.loss_scale, f.images_per_sec,
              100 * f.data_wait_share, eta >= 0 ? " ETA " + format_duration(eta) : "");
}

void ProgressPrinter::finish() {
  if (!bar_) return;
  std::lock_guard<std::mutex> lock(screen_->mu);
  if (screen_->shown) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  screen_->shown = false;
  screen_->text.clear();
}

}  // namespace rn

// What a training run shows and leaves while it runs:
//
//   MetricsLog       appends one JSON object per line to RUN_DIR/metrics.jsonl, the record
//                    that report.h plots. Kinds: "train" (each logging interval) and "eval"
//                    (each evaluation), or any other kind through MetricsRecord ("start",
//                    written as a run starts or resumes, names its build and libraries).
//   read_metrics     reads such a file back.
//   ProgressPrinter  the console view: a bar redrawn in place on a terminal, plain log lines
//                    (through the project logger, so also in train.log) at each logging
//                    interval.
//
// Units in the records: loss per sample (mean); lr as applied; top1 and top5 as fractions in
// [0, 1]; images_per_sec over the last logging interval; data_wait_share the fraction of
// step time spent waiting for input, in [0, 1]; skipped_steps the total number of steps
// skipped for overflow so far; time in seconds of training so far (continued across
// resumes). Values that are not finite (a diverged loss) are written as null.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace rn {

// A record of any kind, built field by field:
//   log.append(MetricsRecord("grad", epoch, step).add("norm", 3.2).add("zeros", int64_t{4}));
// Fields keep the order they are added in; "kind", "epoch", "step" come first, "time" is
// added by MetricsLog. Adding a field twice, or one of those four names, is an error.
class MetricsRecord {
 public:
  MetricsRecord(std::string kind, int64_t epoch, int64_t step);

  template <typename T>
  requires std::is_arithmetic_v<T> MetricsRecord& add(std::string_view key, T value) {
    check_new_key(key);
    if constexpr (std::is_integral_v<T>) {
      fields_[std::string(key)] = static_cast<int64_t>(value);
    } else {
      fields_[std::string(key)] = static_cast<double>(value);
    }
    return *this;
  }

  MetricsRecord& add(std::string_view key, std::string_view text) {
    check_new_key(key);
    fields_[std::string(key)] = std::string(text);
    return *this;
  }
  MetricsRecord& add(std::string_view key, bool flag) {
    check_new_key(key);
    fields_[std::string(key)] = flag;
    return *this;
  }

  // Every field of a flat JSON object of numbers, booleans and strings (what a module
  // outside train reports, e.g. prof's pipeline_json), in its order.
  MetricsRecord& add_fields(const nlohmann::json& object);

  const nlohmann::ordered_json& fields() const { return fields_; }

 private:
  void check_new_key(std::string_view key) const;
  nlohmann::ordered_json fields_;
};

struct TrainMetrics {
  int64_t epoch = 0;
  int64_t step = 0;  // optimizer steps done
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;
  double images_per_sec = 0;
  double data_wait_share = 0;
  int64_t skipped_steps = 0;
  std::map<std::string, double> extra{};  // further named numbers, written after the standard fields
};

struct EvalMetrics {
  int64_t epoch = 0;
  int64_t step = 0;
  double loss = 0;
  double top1 = 0;
  double top5 = 0;
  std::map<std::string, double> extra{};
};

class MetricsLog {
 public:
  static constexpr const char* kFileName = "metrics.jsonl";

  // Opens RUN_DIR/metrics.jsonl for appending (creating it, not the folder). A resumed run
  // continues the file: a torn last line left by a killed run is cut off first (with a
  // warning), and "time" continues from the last record's.
  // write = false (the ranks of a data-parallel job other than 0): records go nowhere.
  explicit MetricsLog(const std::string& run_dir, bool write = true);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void log_train(const TrainMetrics& m);
  void log_eval(const EvalMetrics& m);
  // Adds "time" and writes the record as one line, flushed. Thread-safe.
  void append(const MetricsRecord& record);

  double elapsed_seconds() const;  // the "time" the next record would get
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  double time_offset_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
};

// Every record of a metrics.jsonl file, in order. A last line without its newline that is
// not valid JSON (the run was killed while writing it) is ignored; any other line that is
// not a JSON object with a string "kind" is an error naming the file and line, or, with
// `skip_malformed` (the report, which must not stop a run), left out with one warning that
// counts them. Blank lines are skipped.
std::vector<nlohmann::json> read_metrics(const std::string& path, bool skip_malformed = false);

// Cuts a torn last line (no newline: the writer was killed mid-line) off an appended-to file
// (metrics.jsonl, grad_summary.jsonl), so that the next record starts on a line of its own;
// warns naming the file. Returns the file's remaining text ("" if it does not exist).
std::string cut_torn_last_line(const std::string& path);

// Everything the console shows about one step. Counts are 1-based as displayed: during the
// first step of the first epoch, epoch = 1 and step_in_epoch = 1.
struct ProgressFields {
  int64_t epoch = 0, epochs = 0;
  int64_t step_in_epoch = 0, steps_per_epoch = 0;
  int64_t step = 0, total_steps = 0;  // global optimizer steps done and planned (ETA); 0 total: no ETA
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;
  double images_per_sec = 0;
  double data_wait_share = 0;  // [0, 1]
};

class ProgressPrinter {
 public:
  enum class Mode {
    automatic,  // bar when stderr is a terminal, else lines
    bar,        // a one-line bar redrawn in place with \r, plus the log lines
    lines,      // only the log lines
  };

  // The bar is written to `bar_out`. When that is stderr, the logger's stderr sink is
  // wrapped for the printer's lifetime so that any log message (a loss-scale change, a
  // skipped sample) erases the bar, prints, and redraws it below instead of tearing it;
  // create the printer before threads that log are started, and destroy it after they stop.
  explicit ProgressPrinter(Mode mode = Mode::automatic, std::FILE* bar_out = stderr);
  ~ProgressPrinter();
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;

  // Every step. Costs a clock read unless a redraw is due (at most 10 per second, and at
  // the last step of an epoch).
  void update(const ProgressFields& fields);
  // Each logging interval: one line through RN_LOG_INFO, in both modes:
  //   epoch 2/4 step 120/469 loss 0.5123 lr 0.1 scale 128 img/s 1234.5 data wait 3.2% ETA 5m12s
  // The scale is not called "loss scale" here: grep "loss scale" train.log stays the history
  // of its changes.
  void log_line(const ProgressFields& fields);
  // Leaves the last bar on screen and moves to a new line. Called by the destructor.
  void finish();

  bool bar_mode() const { return bar_; }

  // Seconds left at the average rate since the first update(); negative when unknown.
  double eta_seconds(const ProgressFields& fields) const;

  struct Screen;  // the bar currently on screen, shared with the wrapped log sink

 private:
  void draw(const ProgressFields& fields);

  bool bar_ = false;
  std::FILE* out_;
  std::shared_ptr<Screen> screen_;
  bool have_first_ = false;
  int64_t first_step_ = 0;
  std::chrono::steady_clock::time_point first_time_, last_draw_;
  bool wrapped_sinks_ = false;
};

// "1h02m", "5m12s", "42s"; "?" for a negative or non-finite duration.
std::string format_duration(double seconds);

}  // namespace rn

#include "train/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/check.h"
#include "core/log.h"
#include "log_capture.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/checkpoint_file.h"
#include "train/grad_monitor.h"
#include "train/report.h"

namespace rn {
namespace {

using ::testing::StartsWith;

void append_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::app | std::ios::binary);
  f << text;
}

TrainMetrics train_at(int64_t epoch, int64_t step, double loss) {
  TrainMetrics m;
  m.epoch = epoch;
  m.step = step;
  m.loss = loss;
  m.lr = 0.1;
  m.loss_scale = 128;
  m.images_per_sec = 1500.5;
  m.data_wait_share = 0.125;
  m.skipped_steps = 3;
  return m;
}

TEST(Metrics, RoundTrip) {
  TestDir dir;
  {
    MetricsLog log(dir.path().string());
    TrainMetrics t = train_at(1, 50, 2.25);
    t.extra["grad_norm"] = 4.5;
    log.log_train(t);
    log.log_eval({.epoch = 1, .step = 100, .loss = 1.5, .top1 = 0.625, .top5 = 0.875, .extra = {}});
    log.append(MetricsRecord("grad", 1, 100).add("zeros", 7).add("norm", 0.5f));
    EXPECT_EQ(log.path(), dir.file("metrics.jsonl"));
  }
  std::vector<nlohmann::json> r = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0]["kind"], "train");
  EXPECT_EQ(r[0]["epoch"], 1);
  EXPECT_EQ(r[0]["step"], 50);
  EXPECT_DOUBLE_EQ(r[0]["loss"].get<double>(), 2.25);
  EXPECT_DOUBLE_EQ(r[0]["lr"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(r[0]["loss_scale"].get<double>(), 128);
  EXPECT_DOUBLE_EQ(r[0]["images_per_sec"].get<double>(), 1500.5);
  EXPECT_DOUBLE_EQ(r[0]["data_wait_share"].get<double>(), 0.125);
  EXPECT_EQ(r[0]["skipped_steps"], 3);
  EXPECT_DOUBLE_EQ(r[0]["grad_norm"].get<double>(), 4.5);
  EXPECT_TRUE(r[0]["time"].is_number());
  EXPECT_GE(r[0]["time"].get<double>(), 0);
  EXPECT_EQ(r[1]["kind"], "eval");
  EXPECT_DOUBLE_EQ(r[1]["top1"].get<double>(), 0.625);
  EXPECT_DOUBLE_EQ(r[1]["top5"].get<double>(), 0.875);
  EXPECT_EQ(r[2]["kind"], "grad");
  EXPECT_EQ(r[2]["zeros"], 7);
  EXPECT_TRUE(r[2]["zeros"].is_number_integer());

  // One object per line, "kind" first, for people reading the file.
  std::string text = read_text_file(dir.file("metrics.jsonl"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
  EXPECT_EQ(text.rfind("{\"kind\":\"train\",\"epoch\":1,\"step\":50,", 0), 0u);
}

TEST(Metrics, AppendsAcrossRunsAndContinuesTheClock) {
  TestDir dir;
  { MetricsLog(dir.path().string()).log_train(train_at(1, 10, 3)); }
  // A previous run that got to 100 seconds.
  append_text(dir.file("metrics.jsonl"), "{\"kind\":\"train\",\"epoch\":1,\"step\":20,\"loss\":2,\"time\":100}\n");
  {
    MetricsLog log(dir.path().string());
    EXPECT_GE(log.elapsed_seconds(), 100);
    log.log_train(train_at(1, 30, 1));
  }
  auto r = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2]["step"], 30);
  EXPECT_GE(r[2]["time"].get<double>(), 100);
}

TEST(Metrics, NonFiniteValuesAreNull) {
  TestDir dir;
  { MetricsLog(dir.path().string()).log_train(train_at(1, 10, std::nan(""))); }
  auto r = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0]["loss"].is_null());
}

TEST(Metrics, TornLastLineIsIgnored) {
  TestDir dir;
  { MetricsLog(dir.path().string()).log_train(train_at(1, 10, 3)); }
  append_text(dir.file("metrics.jsonl"), "{\"kind\":\"train\",\"epoch\":1,\"step\":20,\"lo");
  auto r = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]["step"], 10);

  // A resumed run cuts the torn line off before appending, so the file stays readable.
  { MetricsLog(dir.path().string()).log_train(train_at(1, 20, 2)); }
  r = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1]["step"], 20);
}

// Writes `text` as a metrics file and returns read_metrics()'s error, prefixed by the path.
std::string metrics_error(const TestDir& dir, const std::string& text) {
  const std::string path = dir.file("metrics.jsonl");
  append_text(path, text);
  try {
    read_metrics(path);
  } catch (const Error& e) {
    const std::string what = e.what();
    const size_t at = what.find(path);
    return at == std::string::npos ? "(path not named) " + what : what.substr(at + path.size());
  }
  return "(no error)";
}

TEST(Metrics, MalformedMiddleLineNamesFileAndLine) {
  TestDir dir;
  EXPECT_THAT(
      metrics_error(dir,
                    "{\"kind\":\"train\",\"step\":1}\n\n{\"kind\":\"train\",\"st\n{\"kind\":\"train\",\"step\":3}\n"),
      StartsWith(":3:"));
}

// The report reads with skip_malformed: a damaged line is left out with one warning, and the
// report (written at every epoch's end) does not stop the run.
TEST(Metrics, TheReportLeavesMalformedLinesOut) {
  TestDir dir;
  append_text(dir.file("metrics.jsonl"),
              "{\"kind\":\"train\",\"step\":1}\n{\"kind\":\"tr\n[1]\n{\"kind\":\"train\",\"step\":3}\n");
  LogCapture log;
  const auto r = read_metrics(dir.file("metrics.jsonl"), /*skip_malformed=*/true);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1]["step"], 3);
  EXPECT_NE(log.text().find("metrics.jsonl: 2 malformed lines left out (the first at line 2)"), std::string::npos)
      << log.text();
  EXPECT_NO_THROW(write_report(dir.path().string()));
  EXPECT_TRUE(std::filesystem::exists(dir.file("report.html")));
}

TEST(Metrics, MalformedCompleteLastLineIsAnError) {
  TestDir dir;
  EXPECT_THAT(metrics_error(dir, "{\"kind\":\"train\",\"step\":1}\n{oops}\n"), StartsWith(":2:"));
}

// A number too large for a double is nlohmann's out_of_range, not a parse_error: it went
// past read_metrics uncaught.
TEST(Metrics, NumberTooLargeIsAnErrorNamingFileAndLine) {
  TestDir dir;
  EXPECT_THAT(metrics_error(
                  dir, "{\"kind\":\"train\",\"step\":1}\n{\"kind\":\"train\",\"loss\":1e999}\n{\"kind\":\"train\"}\n"),
              StartsWith(":2:"));
}

TEST(Metrics, RecordWithoutKindIsAnError) {
  TestDir dir;
  EXPECT_THAT(metrics_error(dir, "{\"kind\":\"train\",\"step\":1}\n[1, 2]\n"), StartsWith(":2:"));
}

TEST(Metrics, RecordRejectsReservedAndRepeatedKeys) {
  MetricsRecord r("x", 0, 0);
  r.add("a", 1.0);
  EXPECT_THROW(r.add("a", 2.0), Error);
  EXPECT_THROW(r.add("time", 2.0), Error);
  EXPECT_THROW(r.add("step", 2), Error);
}

TEST(Metrics, FormatDuration) {
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(312), "5m12s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

ProgressFields fields_at(int64_t step_in_epoch) {
  return {.epoch = 2,
          .epochs = 4,
          .step_in_epoch = step_in_epoch,
          .steps_per_epoch = 100,
          .step = 100 + step_in_epoch,
          .total_steps = 400,
          .loss = 0.5123,
          .lr = 0.1,
          .loss_scale = 128,
          .images_per_sec = 1234.5,
          .data_wait_share = 0.032};
}

TEST(ProgressPrinter, LinesModeLogsOnlyAtLogInterval) {
  LogCapture capture;
  {
    ProgressPrinter p(ProgressPrinter::Mode::lines);
    EXPECT_FALSE(p.bar_mode());
    for (int s = 1; s <= 100; ++s) {
      p.update(fields_at(s));
      if (s % 50 == 0) p.log_line(fields_at(s));
    }
  }
  std::string text = capture.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("epoch 2/4 step 50/100 loss 0.5123 lr 0.1 scale 128 img/s 1234.5 data wait 3.2%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("step 100/100"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA "), std::string::npos) << text;
  // The progress line must not pollute `grep "loss scale" train.log`, the scale's history.
  EXPECT_EQ(text.find("loss scale"), std::string::npos) << text;
}

TEST(ProgressPrinter, BarRedrawsInPlaceAtMostTenTimesASecond) {
  TestDir dir;
  const std::string path = dir.file("bar.txt");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  {
    ProgressPrinter p(ProgressPrinter::Mode::bar, f);
    EXPECT_TRUE(p.bar_mode());
    for (int s = 1; s <= 99; ++s) p.update(fields_at(s));  // far faster than 10 per second
    p.update(fields_at(100));                              // the epoch's last step is always drawn
  }
  std::fclose(f);
  std::string text = read_text_file(path);
  long draws = std::count(text.begin(), text.end(), '\r');
  EXPECT_GE(draws, 2);
  EXPECT_LE(draws, 4) << text;
  EXPECT_NE(text.find("epoch 2/4 ["), std::string::npos) << text;
  EXPECT_NE(text.find("] 100/100 loss 0.5123"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');  // finish() leaves the cursor on a fresh line
}

}  // namespace
}  // namespace rn

namespace rn {
namespace {

TEST(MetricsRecord, AddFieldsKeepsTypesAndRefusesNesting) {
  MetricsRecord r("pipeline", 1, 10);
  r.add_fields(nlohmann::json{{"wait_share", 0.25}, {"batches", 7}, {"input_bound", true}, {"verdict", "ok"}});
  const auto& f = r.fields();
  EXPECT_TRUE(f["batches"].is_number_integer());
  EXPECT_EQ(f["batches"].get<int64_t>(), 7);
  EXPECT_DOUBLE_EQ(f["wait_share"].get<double>(), 0.25);
  EXPECT_TRUE(f["input_bound"].get<bool>());
  EXPECT_EQ(f["verdict"].get<std::string>(), "ok");
  EXPECT_THROW(r.add_fields(nlohmann::json{{"nested", {{"a", 1}}}}), Error);
  EXPECT_THROW(r.add_fields(nlohmann::json::array()), Error);
}

// Every record a run writes counts epochs from 1: train, grad and device records the epoch
// being trained, eval, memory and pipeline records the one just completed (so an epoch's
// last train record and its evaluation carry the same number). A train record is written every
// log interval and at each epoch's last step, so that every step's loss is in one record.
TEST(MetricsRun, EveryRecordCountsEpochsFrom1) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.schedule.epochs = 2;
  cfg.run.log_interval_steps = 3;
  cfg.run.eval_interval_epochs = 1;
  cfg.diagnostics.grad_monitor_interval = 2;
  cfg.validate();
  const TrainResult r = train(cfg, {});
  ASSERT_TRUE(r.complete);
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> epoch_step;  // kind -> (epoch, step)
  for (const auto& j : read_metrics(r.run_dir + "/metrics.jsonl"))
    epoch_step[j["kind"].get<std::string>()].emplace_back(j["epoch"].get<int64_t>(), j["step"].get<int64_t>());
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(epoch_step["train"], (std::vector<P>{{1, 3}, {1, 4}, {2, 6}, {2, 8}}));
  EXPECT_EQ(epoch_step["grad"], (std::vector<P>{{1, 1}, {1, 2}, {1, 4}, {2, 6}, {2, 8}}));  // and step 1
  EXPECT_EQ(epoch_step["eval"], (std::vector<P>{{1, 4}, {2, 8}}));
  EXPECT_EQ(epoch_step["pipeline"], (std::vector<P>{{1, 4}, {2, 8}}));
  EXPECT_EQ(epoch_step["start"], (std::vector<P>{{1, 0}}));
  for (const auto& [kind, list] : epoch_step)
    for (const auto& [epoch, step] : list) {
      EXPECT_GE(epoch, 1) << kind << " at step " << step;
      EXPECT_LE(epoch, 2) << kind << " at step " << step;
    }
  // The gradient summary counts the same way; `resnet summary` names the first epoch 1.
  const std::vector<GradRecord> grads = read_grad_summary(r.run_dir + "/grad_summary.jsonl");
  ASSERT_FALSE(grads.empty());
  EXPECT_EQ(grads.front().epoch, 1);
  EXPECT_EQ(grads.back().epoch, 2);
}

}  // namespace
}  // namespace rn

#include "train/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/check.h"
#include "test_dir.h"
#include "train/checkpoint_file.h"
#include "train/metrics.h"
#include "train/svg_plot.h"

namespace rn {
namespace {

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

const char* const kPlotTitles[] = {"Loss",       "Validation accuracy", "Learning rate",
                                   "Loss scale", "Throughput",          "Data-wait share"};

// A small run: 3 epochs of 100 steps, logged every 10 steps, evaluated each epoch, with a
// loss-scale backoff and a growth. Records count epochs from 1, as the trainer writes them;
// `train_epochs_from_0` writes them as runs before 2026-12-03 did (train records from 0, no
// "epochs_from" in a start record).
void write_run(const std::string& run_dir, bool train_epochs_from_0 = false) {
  MetricsLog log(run_dir);
  if (!train_epochs_from_0) log.append(MetricsRecord("start", 1, 0).add("epochs_from", int64_t{1}));
  int64_t skipped = 0;
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {
    for (int64_t s = 10; s <= 100; s += 10) {
      int64_t step = (epoch - 1) * 100 + s;
      TrainMetrics m;
      m.epoch = train_epochs_from_0 ? epoch - 1 : epoch;
      m.step = step;
      m.loss = 2.5 * std::exp(-static_cast<double>(step) / 120.0) + 0.3;
      m.lr = step < 50 ? 0.1 * static_cast<double>(step) / 50 : 0.1 * 0.5 * (1 + std::cos(M_PI * (step - 50) / 250.0));
      m.loss_scale = step < 120 ? 128 : step < 200 ? 64 : 128;
      if (step == 120) ++skipped;
      m.images_per_sec = 1000 + static_cast<double>(step % 70);
      m.data_wait_share = 0.02 + 0.01 * static_cast<double>(step % 3);
      m.skipped_steps = skipped;
      log.log_train(m);
    }
    log.log_eval({.epoch = epoch,
                  .step = epoch * 100,
                  .loss = 1.2 - 0.2 * static_cast<double>(epoch),
                  .top1 = 0.5 + 0.1 * static_cast<double>(epoch),
                  .top5 = 0.8 + 0.05 * static_cast<double>(epoch),
                  .extra = {}});
  }
}

TEST(Report, HasEveryPlotAndTheSummary) {
  TestDir dir;
  write_run(dir.path().string());
  {
    std::ofstream f(dir.file("config.yaml"));
    f << "model:\n  arch: resnet20 # <cifar>\n";
  }
  write_report(dir.path().string());
  std::string html = read_text_file(dir.file("report.html"));

  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count_of(html, "<svg"), 6);
  EXPECT_EQ(count_of(html, "</svg>"), 6);
  for (const char* title : kPlotTitles) {
    EXPECT_NE(html.find(std::string("font-weight=\"bold\">") + title + "</text>"), std::string::npos) << title;
  }
  EXPECT_EQ(html.find("no data"), std::string::npos);
  // Self-contained: nothing fetched from elsewhere.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://www.w3.org/2000/svg"), html.find("http"));  // the namespace is the only URL
  EXPECT_EQ(html.find("https:"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);

  // The summary's numbers.
  EXPECT_NE(html.find("<th>final top-1</th><td>80.00 %</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>best top-1</th><td>80.00 % (epoch 3)</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>final top-5</th><td>95.00 %</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>total steps</th><td>300</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>skipped overflow steps</th><td>1</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>median images/s</th><td>10"), std::string::npos);
  EXPECT_NE(html.find("<th>epochs</th><td>3</td>"), std::string::npos);
  // No number went wrong on its way into the page.
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_EQ(html.find("inf"), std::string::npos);
  // Path coordinates are plain numbers.
  std::regex path_data("d=\"M[0-9.,ML ]+\"");
  EXPECT_TRUE(std::regex_search(html, path_data));

  // The config, verbatim but escaped.
  EXPECT_NE(html.find("<pre>model:\n  arch: resnet20 # &lt;cifar&gt;\n</pre>"), std::string::npos);
  // No temporary left behind by the atomic write.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 3);  // metrics.jsonl, config.yaml, report.html
}

// A run written before train records counted epochs from 1 still counts its epochs right.
TEST(Report, TrainRecordsOfOlderRunsCountedEpochsFrom0) {
  for (const bool from_0 : {false, true}) {
    TestDir dir;
    write_run(dir.path().string(), from_0);
    // Only its train records can say how far a run got when it stopped between evaluations.
    std::filesystem::path metrics = dir.file("metrics.jsonl");
    std::string text = read_text_file(metrics.string());
    text.erase(text.rfind("{\"kind\":\"eval\""));
    std::ofstream(metrics) << text;
    write_report(dir.path().string());
    const std::string html = read_text_file(dir.file("report.html"));
    EXPECT_NE(html.find("<th>epochs</th><td>3</td>"), std::string::npos) << (from_0 ? "from 0" : "from 1");
  }
}

// A run shorter than one log interval has no train records: its epochs and steps come from
// the evaluation.
TEST(Report, ARunWithoutTrainRecordsCountsFromItsEvaluation) {
  TestDir dir;
  {
    MetricsLog log(dir.path().string());
    log.log_eval({.epoch = 1, .step = 2, .loss = 2.3, .top1 = 0.1, .top5 = 0.5, .extra = {}});
  }
  write_report(dir.path().string());
  const std::string html = read_text_file(dir.file("report.html"));
  EXPECT_NE(html.find("<th>epochs</th><td>1</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>total steps</th><td>2</td>"), std::string::npos);
}

TEST(Report, InputPipelineTablePerEpoch) {
  TestDir dir;
  write_run(dir.path().string());
  {
    MetricsLog log(dir.path().string());
    for (int64_t epoch = 1; epoch <= 2; ++epoch) {
      MetricsRecord r("pipeline", epoch, epoch * 100);
      r.add("batches", int64_t{100}).add("read_s", 0.5).add("decode_s", 2.0).add("augment_s", 1.0);
      r.add("collate_s", 0.25).add("copy_s", 0.1).add("step_s", 30.0).add("wait_share", 0.012);
      r.add("cache_hits", int64_t{70}).add("skipped", int64_t{3});
      if (epoch == 2) r.add("other_s", 0.75);  // epoch 1 as an older run wrote it: no other_s
      r.add("verdict", std::string_view("compute-bound: <1.2%> waiting"));
      log.append(r);
    }
  }
  write_report(dir.path().string());
  std::ifstream in(dir.file("report.html"));
  const std::string html{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_NE(html.find("<h2>Input pipeline</h2>"), std::string::npos);
  EXPECT_EQ(count_of(html, "compute-bound: &lt;1.2%&gt; waiting"), 2);  // one row per epoch, escaped
  EXPECT_NE(html.find("<td>20.00</td>"), std::string::npos);            // decode: 2 s over 100 batches
  EXPECT_NE(html.find("<td>1.2%</td><td>70</td><td>3</td>"), std::string::npos);  // wait, cache hits, bad files
  // step, then the rest of the loop: 7.50 ms per batch, "-" where the record has none.
  EXPECT_NE(html.find("<td>300.00</td><td>7.50</td><td>1.2%</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>300.00</td><td>-</td><td>1.2%</td>"), std::string::npos);
}

TEST(Report, CommunicationTableOnlyForDataParallelRuns) {
  TestDir dir;
  write_run(dir.path().string());
  write_report(dir.path().string());
  EXPECT_EQ(read_text_file(dir.file("report.html")).find("<h2>Communication</h2>"), std::string::npos);
  {
    MetricsLog log(dir.path().string());
    MetricsRecord r("comm", 1, 100);
    r.add("ranks", int64_t{2}).add("buckets", int64_t{7}).add("bytes_per_step", int64_t{3} << 20);
    r.add("comm_ms", 12.5).add("exposed_ms", 2.5).add("hidden_share", 0.8).add("step_ms", 250.0);
    log.append(r);
  }
  write_report(dir.path().string());
  const std::string html = read_text_file(dir.file("report.html"));
  EXPECT_NE(html.find("<h2>Communication</h2>"), std::string::npos);
  EXPECT_NE(html.find("<td>3.00</td><td>250.00</td><td>12.50</td><td>80%</td><td>2.50</td>"), std::string::npos)
      << html;
}

TEST(Report, EmptyMetricsSayNoData) {
  TestDir dir;
  { MetricsLog log(dir.path().string()); }  // creates an empty metrics.jsonl
  write_report(dir.path().string());
  std::string html = read_text_file(dir.file("report.html"));
  EXPECT_NE(html.find("<p class=\"nodata\">no data"), std::string::npos);
  EXPECT_EQ(count_of(html, "<svg"), 6);
  EXPECT_EQ(count_of(html, ">no data</text>"), 6);
  EXPECT_NE(html.find("no config.yaml"), std::string::npos);
}

TEST(Report, ShowsPlannedAndMeasuredMemoryPerLevel) {
  const std::vector<nlohmann::json> records = {
      nlohmann::json::parse(R"({"kind":"train","epoch":0,"step":4,"loss":2.0})"),
      nlohmann::json::parse(R"({"kind":"memory","epoch":1,"step":4,"level":1,"batch":32,"planned_arena":10485760,)"
                            R"("planned_total":20971520,"arena_high_water":10485760,"resident":31457280,)"
                            R"("peak_resident":41943040})"),
      nlohmann::json::parse(R"({"kind":"memory","epoch":2,"step":8,"level":2,"batch":32,"planned_arena":5242880,)"
                            R"("planned_total":15728640,"arena_high_water":5242880,"resident":26214400,)"
                            R"("peak_resident":41943040})")};
  const std::string html = render_report_html(records, "", "t");
  EXPECT_NE(html.find("<h2>Memory</h2>"), std::string::npos);
  EXPECT_NE(html.find("<td>O1</td><td>32</td><td>10.0 MiB</td><td>20.0 MiB</td><td>10.0 MiB</td><td>30.0 MiB</td>"
                      "<td>40.0 MiB</td>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<td>O2</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>arena high-water</th>"), std::string::npos);
  EXPECT_NE(render_report_html({}, "", "t").find("no memory records yet"), std::string::npos);
  // On a device the arena's host pages are not measured: the device's peak is shown.
  const std::string device = render_report_html(
      {nlohmann::json::parse(R"({"kind":"memory","epoch":1,"step":4,"level":1,"batch":32,"planned_arena":10485760,)"
                             R"("planned_total":20971520,"arena_high_water":null,"resident":31457280,)"
                             R"("peak_resident":41943040,"device_peak":52428800})")},
      "", "t");
  EXPECT_NE(device.find("<th>device peak</th>"), std::string::npos) << device;
  EXPECT_NE(device.find("<td>20.0 MiB</td><td>50.0 MiB</td>"), std::string::npos) << device;
}

TEST(Report, MissingMetricsSayNoDataButMissingFolderIsAnError) {
  TestDir dir;
  write_report(dir.path().string());
  EXPECT_NE(read_text_file(dir.file("report.html")).find("no data"), std::string::npos);
  EXPECT_THROW(write_report(dir.file("absent")), Error);
}

TEST(Report, SinglePointSeries) {
  TestDir dir;
  {
    MetricsLog log(dir.path().string());
    TrainMetrics m;
    m.epoch = 1, m.step = 10, m.loss = 2, m.lr = 0.1, m.loss_scale = 128, m.images_per_sec = 500;
    log.log_train(m);
    log.log_eval({.epoch = 1, .step = 10, .loss = 2.1, .top1 = 0.25, .top5 = 0.5, .extra = {}});
  }
  write_report(dir.path().string());
  std::string html = read_text_file(dir.file("report.html"));
  EXPECT_EQ(count_of(html, "<svg"), 6);
  EXPECT_EQ(html.find("no data"), std::string::npos);
  EXPECT_GE(count_of(html, "<circle"), 7);  // each lone point is drawn as a marker
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_EQ(html.find("inf"), std::string::npos);
  EXPECT_NE(html.find("<th>final top-1</th><td>25.00 %</td>"), std::string::npos);
}

TEST(Report, ResumedRunSupersedesWhatItRewoundOver) {
  auto train = [](int step, double loss) {
    return nlohmann::json{{"kind", "train"}, {"epoch", 1}, {"step", step}, {"loss", loss}, {"time", step}};
  };
  std::vector<nlohmann::json> records = {
      train(10, 3),  train(20, 2.5), {{"kind", "eval"}, {"epoch", 1}, {"step", 20}, {"top1", 0.1}},
      train(30, 99), train(20, 2.4), train(30, 2.2)};
  std::string html = render_report_html(records, "", "resumed");
  EXPECT_NE(html.find("<th>records</th><td>3 train, 0 eval</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<th>resumes (rewound to a checkpoint)</th><td>1</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>final training loss</th><td>2.2000</td>"), std::string::npos);
}

// A resume's start record names the step of its checkpoint: every kind of record the sessions
// before it wrote past that step is superseded (the per-epoch tables too, which used to show an
// epoch twice), and that counts as a rewind; a resume from the step it stopped at does not.
// Device samples, several at one step by nature, are all kept.
TEST(Report, AResumeSupersedesEveryKindPastItsCheckpoint) {
  auto rec = [](const char* kind, int epoch, int step) {
    return nlohmann::json{{"kind", kind}, {"epoch", epoch}, {"step", step}, {"time", step}};
  };
  auto train = [&](int epoch, int step) {
    nlohmann::json r = rec("train", epoch, step);
    r["loss"] = 1.0;
    return r;
  };
  auto start = [](int step, bool resumed) {
    return nlohmann::json{{"kind", "start"}, {"epoch", 1}, {"step", step}, {"resumed", resumed}};
  };
  auto pipeline = [&](int epoch, int step) {
    nlohmann::json r = rec("pipeline", epoch, step);
    r["batches"] = 10;
    r["wait_share"] = 0.1;
    return r;
  };
  auto memory = [&](int epoch, int step) {
    nlohmann::json r = rec("memory", epoch, step);
    r["level"] = 0;
    return r;
  };
  auto device = [&](int step, double time, double util) {
    nlohmann::json r = rec("device", 1, step);
    r["time"] = time;
    r["cpu_util"] = util;
    return r;
  };
  // Stopped at 10 (the epoch's end), resumed there: no rewind. Killed at 25 after the
  // checkpoint at 20 was written: the resume from 20 drops epoch 3's records past it.
  std::vector<nlohmann::json> records = {
      start(0, false), train(1, 5),   device(5, 1, 50), device(5, 2, 60), device(5, 3, 70), train(1, 10),
      pipeline(1, 10), memory(1, 10), start(10, true),  train(2, 20),     pipeline(2, 20),  train(3, 25),
      pipeline(3, 30), memory(3, 30), start(20, true),  train(3, 25),     train(3, 30),     pipeline(3, 30)};
  const std::string html = render_report_html(records, "", "resumed");
  EXPECT_NE(html.find("<th>resumes (rewound to a checkpoint)</th><td>1</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<th>records</th><td>5 train, 0 eval</td>"), std::string::npos) << html;
  EXPECT_EQ(count_of(html, "<tr><td>3</td>"), 1) << "epoch 3's pipeline row once:\n" << html;
  EXPECT_EQ(count_of(html, "<tr><td>1</td><td>O0</td>"), 1) << "the memory row of epoch 1 alone:\n" << html;
  EXPECT_EQ(count_of(html, "<title>CPU utilisation (mean of cores) at "), 3) << html;
  // A start record whose "resumed" is not a boolean (an edited file) rewinds nothing, and throws nothing.
  records.push_back({{"kind", "start"}, {"epoch", 1}, {"step", 0}, {"resumed", "yes"}});
  EXPECT_NE(render_report_html(records, "", "edited").find("<th>records</th><td>5 train"), std::string::npos);
}

// "start" records (one per start and resume) name the build; they rewind nothing, and a change
// of build is shown with the step it took over at.
TEST(Report, NamesTheBuildsThatRanIt) {
  auto train = [](int step) {
    return nlohmann::json{{"kind", "train"}, {"epoch", 1}, {"step", step}, {"loss", 1.0}, {"time", step}};
  };
  auto start = [](int step, const char* software, const char* libraries) {
    return nlohmann::json{{"kind", "start"},        {"epoch", 0},         {"step", step}, {"software", software},
                          {"libraries", libraries}, {"resumed", step > 0}};
  };
  std::vector<nlohmann::json> records = {
      start(0, "resnet.cpp A", "oneDNN 1"),      train(10), train(20), start(20, "resnet.cpp A", "oneDNN 1"), train(30),
      start(30, "resnet.cpp B <x>", "oneDNN 2"), train(40)};
  std::string html = render_report_html(records, "", "builds");
  EXPECT_NE(html.find("<th>records</th><td>4 train, 0 eval</td>"), std::string::npos) << html;
  EXPECT_EQ(html.find("resumes (rewound"), std::string::npos) << "a start record rewound the history";
  EXPECT_NE(html.find("<th>software</th><td>resnet.cpp A; then resnet.cpp B &lt;x&gt; from step 30</td>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<th>libraries</th><td>oneDNN 2</td>"), std::string::npos) << html;
  // One build: named once, no "then"; no start records (older runs): no rows.
  html = render_report_html({start(0, "resnet.cpp A", "oneDNN 1"), train(10), start(10, "resnet.cpp A", "oneDNN 1")},
                            "", "one build");
  EXPECT_NE(html.find("<th>software</th><td>resnet.cpp A</td>"), std::string::npos) << html;
  html = render_report_html({train(10)}, "", "older run");
  EXPECT_EQ(html.find("<th>software</th>"), std::string::npos);
}

TEST(SvgPlot, TicksLabelsAndLogAxis) {
  PlotSeries s{"scale", {0, 100, 200, 300}, {128, 64, 128, 1024}};
  std::string svg =
      svg_line_plot({s}, {.title = "Loss scale", .x_label = "step", .y_label = "scale", .y_scale = PlotScale::log2});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find(">128</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">300</text>"), std::string::npos);

  PlotSeries lin{"", {0, 1, 2}, {0.001, 0.0025, 0.004}};
  svg = svg_line_plot({lin}, {.title = "lr"});
  EXPECT_NE(svg.find(">0.0040</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(SvgPlot, GapsAndNoData) {
  PlotSeries gappy{"", {0, 1, 2, 3}, {1, std::nan(""), 2, 3}};
  std::string svg = svg_line_plot({gappy}, {.title = "t"});
  EXPECT_EQ(count_of(svg, "M"), 2) << svg;  // the line breaks at the NaN
  EXPECT_EQ(svg_line_plot({}, {.title = "t"}).find(">no data</text>") == std::string::npos, false);
  PlotSeries non_positive{"", {0, 1}, {0, -1}};
  EXPECT_NE(svg_line_plot({non_positive}, {.title = "t", .y_scale = PlotScale::log10}).find(">no data</text>"),
            std::string::npos);
}

TEST(SvgPlot, LongSeriesIsThinned) {
  PlotSeries s;
  for (int i = 0; i < 200000; ++i) {
    s.x.push_back(i);
    s.y.push_back(std::sin(i * 0.001) + (i == 123456 ? 5 : 0));
  }
  std::string svg = svg_line_plot({s}, {.title = "long"});
  EXPECT_LT(svg.size(), 60000u);
  EXPECT_NE(svg.find(">5</text>"), std::string::npos) << "the spike still sets the y range";
}

TEST(SvgPlot, EscapesText) {
  std::string svg = svg_line_plot({}, {.title = "a<b & \"c\""});
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

}  // namespace
}  // namespace rn

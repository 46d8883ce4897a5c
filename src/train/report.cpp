#include "train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "core/check.h"
#include "train/checkpoint_file.h"
#include "train/metrics.h"
#include "train/svg_plot.h"

namespace rn {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A record's number, or NaN when the field is missing, null (a non-finite value) or not a number.
double number(const json& record, const char* key) {
  auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : kNaN;
}

// A record's string, or "" when the field is missing or not a string.
std::string text(const json& record, const char* key) {
  auto it = record.find(key);
  return it != record.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The records that describe the run as it finally went: what resumed runs rewound over is
// dropped (see report.h).
struct History {
  std::vector<const json*> kept;  // every kind, in file order
  std::vector<const json*> train, eval;
  std::vector<const json*> grad, device, variance, variance_warnings;  // diagnostics.h
  std::vector<const json*> starts;  // what started and resumed the run (its build and libraries), never rewound
  int rewinds = 0;
  int sessions_with_variance = 0;  // "variance" records kept: one per session that trained
};

History build_history(const std::vector<json>& records) {
  std::vector<const json*> kept;
  double max_step = -INFINITY;
  std::map<std::string, double> last_step_of_kind;
  History h;
  auto recount = [&] {
    max_step = -INFINITY;
    last_step_of_kind.clear();
    for (const json* k : kept) {
      double s = number(*k, "step");
      if (!std::isfinite(s)) continue;
      max_step = std::max(max_step, s);
      last_step_of_kind[(*k)["kind"].get<std::string>()] = s;
    }
  };
  for (const json& r : records) {
    const std::string& kind = r["kind"].get_ref<const std::string&>();
    if (kind == "start") {
      // A resume starts at its checkpoint's step: what the sessions before it recorded past
      // that step (a kill after the checkpoint, a rewind to an older one) is superseded.
      h.starts.push_back(&r);
      const double from = number(r, "step");
      const auto resumed = r.find("resumed");
      if (std::isfinite(from) && resumed != r.end() && resumed->is_boolean() && resumed->get<bool>()) {
        const size_t before = kept.size();
        std::erase_if(kept, [&](const json* k) { return number(*k, "step") > from; });
        if (kept.size() != before) {
          ++h.rewinds;
          recount();
        }
      }
      continue;
    }
    double step = number(r, "step");
    if (std::isfinite(step)) {
      // Files without start records (older runs): a step below the last one seen is a resume,
      // and a kind repeating its last step replaces that kind's records. Device samples repeat a
      // step by nature (several per step, during an evaluation or a checkpoint).
      auto last = last_step_of_kind.find(kind);
      bool back = step < max_step;
      bool repeat = kind != "device" && last != last_step_of_kind.end() && step <= last->second;
      if (back || repeat) {
        h.rewinds += back ? 1 : 0;
        std::erase_if(kept, [&](const json* k) {
          return number(*k, "step") >= step && (back || (*k)["kind"].get_ref<const std::string&>() == kind);
        });
        recount();
      }
      max_step = std::max(max_step, step);
      last_step_of_kind[kind] = step;
    }
    kept.push_back(&r);
  }
  for (const json* r : kept) {
    const std::string& kind = (*r)["kind"].get_ref<const std::string&>();
    if (kind == "train") h.train.push_back(r);
    if (kind == "eval") h.eval.push_back(r);
    if (kind == "grad") h.grad.push_back(r);
    if (kind == "device") h.device.push_back(r);
    if (kind == "variance") h.variance.push_back(r);
    if (kind == "variance_warning") h.variance_warnings.push_back(r);
  }
  h.sessions_with_variance = static_cast<int>(h.variance.size());
  h.kept = std::move(kept);
  return h;
}

PlotSeries series_of(const std::vector<const json*>& records, const char* x_key, const char* y_key, std::string label,
                     double y_factor = 1) {
  PlotSeries s;
  s.label = std::move(label);
  for (const json* r : records) {
    s.x.push_back(number(*r, x_key));
    s.y.push_back(number(*r, y_key) * y_factor);
  }
  return s;
}

// The finite values of one field.
std::vector<double> values_of(const std::vector<const json*>& records, const char* key) {
  std::vector<double> v;
  for (const json* r : records) {
    double x = number(*r, key);
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
}

// The last finite value of a field, or NaN.
double last_of(const std::vector<const json*>& records, const char* key) {
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    double v = number(**it, key);
    if (std::isfinite(v)) return v;
  }
  return kNaN;
}

std::string or_na(double v, const std::string& text) { return std::isfinite(v) ? text : "n/a"; }

std::string percent(double fraction) { return or_na(fraction, fmt::format("{:.2f} %", 100 * fraction)); }

// "76.12 % (epoch 88)" for the record with the highest `key`.
std::string best_of(const std::vector<const json*>& eval, const char* key) {
  const json* best = nullptr;
  for (const json* r : eval) {
    double v = number(*r, key);
    if (std::isfinite(v) && (best == nullptr || v > number(*best, key))) best = r;
  }
  if (best == nullptr) return "n/a";
  double epoch = number(*best, "epoch");
  return percent(number(*best, key)) + (std::isfinite(epoch) ? fmt::format(" (epoch {:g})", epoch) : "");
}

// The larger of two figures either of which may be missing (NaN).
double larger(double a, double b) {
  return std::isfinite(a) && std::isfinite(b) ? std::max(a, b) : std::isfinite(a) ? a : b;
}

std::string summary_table(const History& h) {
  // Records count epochs from 1 (the epoch being trained, or the one just completed); a file
  // written before 2026-12-03 counted train records from 0, and its start records have no
  // "epochs_from". A run shorter than one log interval has eval records only.
  const bool train_from_0 =
      std::none_of(h.starts.begin(), h.starts.end(), [](const json* s) { return number(*s, "epochs_from") == 1; });
  const double epochs = larger(last_of(h.train, "epoch") + (train_from_0 ? 1 : 0), last_of(h.eval, "epoch"));
  const double steps = larger(last_of(h.train, "step"), last_of(h.eval, "step"));
  double last_time = kNaN;
  for (const auto* list : {&h.train, &h.eval}) {
    double t = last_of(*list, "time");
    if (std::isfinite(t)) last_time = std::isfinite(last_time) ? std::max(last_time, t) : t;
  }
  std::vector<std::pair<std::string, std::string>> rows = {
      {"final top-1", percent(last_of(h.eval, "top1"))},
      {"best top-1", best_of(h.eval, "top1")},
      {"final top-5", percent(last_of(h.eval, "top5"))},
      {"best top-5", best_of(h.eval, "top5")},
      {"final training loss", or_na(last_of(h.train, "loss"), fmt::format("{:.4f}", last_of(h.train, "loss")))},
      {"final validation loss", or_na(last_of(h.eval, "loss"), fmt::format("{:.4f}", last_of(h.eval, "loss")))},
      {"epochs", or_na(epochs, fmt::format("{:g}", epochs))},
      {"total steps", or_na(steps, fmt::format("{:g}", steps))},
      {"skipped overflow steps",
       or_na(last_of(h.train, "skipped_steps"), fmt::format("{:g}", last_of(h.train, "skipped_steps")))},
      {"median images/s", or_na(median(values_of(h.train, "images_per_sec")),
                                fmt::format("{:.1f}", median(values_of(h.train, "images_per_sec"))))},
      {"median data-wait share", percent(median(values_of(h.train, "data_wait_share")))},
      {"training time", or_na(last_time, format_duration(last_time))},
      {"records", fmt::format("{} train, {} eval", h.train.size(), h.eval.size())},
  };
  if (h.rewinds > 0) rows.emplace_back("resumes (rewound to a checkpoint)", fmt::format("{}", h.rewinds));
  std::string html = "<table class=\"summary\">\n";
  for (const auto& [name, value] : rows) {
    html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", html_escape(name), html_escape(value));
  }
  return html + "</table>\n";
}

// The builds that ran the run (one, or each change of build with the step it took over at) and
// the libraries of the last; "" for runs from before start records.
std::string software_table(const History& h) {
  if (h.starts.empty()) return "";
  std::string software;
  std::string last_software;
  for (const json* s : h.starts) {
    const std::string sw = text(*s, "software");
    if (sw == last_software) continue;
    const double step = number(*s, "step");
    software += fmt::format("{}{}{}", software.empty() ? "" : "; then ", sw,
                            software.empty() || !std::isfinite(step) ? "" : fmt::format(" from step {:g}", step));
    last_software = sw;
  }
  return fmt::format(
      "<table class=\"summary\">\n<tr><th>software</th><td>{}</td></tr>\n"
      "<tr><th>libraries</th><td>{}</td></tr>\n</table>\n",
      html_escape(software), html_escape(text(*h.starts.back(), "libraries")));
}

std::string plots(const History& h) {
  std::vector<std::string> svgs;
  {
    std::vector<PlotSeries> loss = {series_of(h.train, "step", "loss", "training")};
    if (!h.eval.empty()) loss.push_back(series_of(h.eval, "step", "loss", "validation"));
    svgs.push_back(svg_line_plot(loss, {.title = "Loss", .x_label = "step", .y_label = "loss"}));
  }
  svgs.push_back(svg_line_plot(
      {series_of(h.eval, "epoch", "top1", "top-1", 100), series_of(h.eval, "epoch", "top5", "top-5", 100)},
      {.title = "Validation accuracy", .x_label = "epoch", .y_label = "accuracy (%)"}));
  svgs.push_back(svg_line_plot({series_of(h.train, "step", "lr", "lr")},
                               {.title = "Learning rate", .x_label = "step", .y_label = "learning rate"}));
  svgs.push_back(svg_line_plot(
      {series_of(h.train, "step", "loss_scale", "loss scale")},
      {.title = "Loss scale", .x_label = "step", .y_label = "loss scale (log)", .y_scale = PlotScale::log2}));
  svgs.push_back(svg_line_plot({series_of(h.train, "step", "images_per_sec", "images/s")},
                               {.title = "Throughput", .x_label = "step", .y_label = "images/s", .y_min = 0.0}));
  svgs.push_back(
      svg_line_plot({series_of(h.train, "step", "data_wait_share", "data wait", 100)},
                    {.title = "Data-wait share", .x_label = "step", .y_label = "waiting for data (%)", .y_min = 0.0}));
  std::string html = "<div class=\"plots\">\n";
  for (const std::string& svg : svgs) html += "<figure>" + svg + "</figure>\n";
  return html + "</div>\n";
}

bool has_field(const std::vector<const json*>& records, const char* key) {
  return std::any_of(records.begin(), records.end(), [&](const json* r) { return std::isfinite(number(*r, key)); });
}

// The gradient monitor's totals ("grad" records), the device monitor's samples ("device")
// and the throughput-variance analysis ("variance", "variance_warning").
std::string diagnostics_section(const History& h) {
  std::string html;
  if (!h.variance.empty() || !h.variance_warnings.empty()) {
    html += "<table class=\"summary\">\n";
    if (!h.variance.empty()) {
      const json& v = *h.variance.back();
      // One analysis per session: a resumed run shows its last session's.
      html += fmt::format(
          "<tr><th>throughput CV{}</th><td>{:.2f} % over {:g} steps (mean step {:.2f} ms; largest "
          "window spread {:.2f} %)</td></tr>\n",
          h.sessions_with_variance > 1 ? fmt::format(" (the last of {} sessions)", h.sessions_with_variance)
                                       : std::string(),
          100 * number(v, "throughput_cv"), number(v, "steps"), 1e3 * number(v, "mean_step_s"),
          100 * number(v, "max_window_spread"));
    }
    for (const json* w : h.variance_warnings)
      html += fmt::format("<tr><th>variance warning at step {:g}</th><td>{}: {}</td></tr>\n", number(*w, "step"),
                          html_escape(text(*w, "cause")), html_escape(text(*w, "evidence")));
    html += "</table>\n";
  }
  std::vector<std::string> svgs;
  if (!h.grad.empty()) {
    svgs.push_back(svg_line_plot({series_of(h.grad, "step", "grad_norm", "gradient norm"),
                                  series_of(h.grad, "step", "weight_norm", "weight norm")},
                                 {.title = "Gradient and weight norms (all tensors)", .x_label = "step",
                                  .y_label = "L2 norm (log)", .y_scale = PlotScale::log10}));
    svgs.push_back(svg_line_plot({series_of(h.grad, "step", "max_update_ratio", "largest update / weight")},
                                 {.title = "Update-to-weight ratio (largest tensor)", .x_label = "step",
                                  .y_label = "ratio (log)", .y_scale = PlotScale::log10}));
    svgs.push_back(svg_line_plot({series_of(h.grad, "step", "zero_fraction", "zero", 100),
                                  series_of(h.grad, "step", "inf_fraction", "inf", 100),
                                  series_of(h.grad, "step", "nan_fraction", "NaN", 100)},
                                 {.title = "Gradient values zero / inf / NaN", .x_label = "step",
                                  .y_label = "share of values (%)", .y_min = 0.0}));
  }
  struct DevicePlot {
    const char* key;
    const char* title;
    const char* y_label;
    double factor;
  };
  const DevicePlot device_plots[] = {
      {"gpu_util", "GPU utilisation", "%", 1},       {"cpu_util", "CPU utilisation (mean of cores)", "%", 1},
      {"sm_clock_mhz", "SM clock", "MHz", 1},         {"cpu_mhz", "CPU frequency", "MHz", 1},
      {"power_w", "GPU power", "W", 1},               {"temperature_c", "GPU temperature", "C", 1},
      {"mem_used_bytes", "GPU memory used", "GiB", 1.0 / 1073741824}, {"rss_bytes", "Resident memory", "GiB", 1.0 / 1073741824}};
  for (const DevicePlot& p : device_plots)
    if (has_field(h.device, p.key))
      svgs.push_back(svg_line_plot({series_of(h.device, "time", p.key, p.title, p.factor)},
                                   {.title = p.title, .x_label = "training time (s)", .y_label = p.y_label, .y_min = 0.0}));
  if (svgs.empty() && html.empty())
    return "<p class=\"nodata\">no diagnostics records (diagnostics.grad_monitor_interval, diagnostics.device_monitor)</p>\n";
  html += "<div class=\"plots\">\n";
  for (const std::string& svg : svgs) html += "<figure>" + svg + "</figure>\n";
  return html + "</div>\n";
}

constexpr const char* kStyle = R"(
body { font-family: sans-serif; color: #222; margin: 24px auto; max-width: 1180px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 0; }
.nodata { color: #a33; font-weight: bold; }
table.summary { border-collapse: collapse; }
table.summary th { text-align: left; font-weight: normal; color: #555; padding: 3px 24px 3px 0; }
table.summary td { font-variant-numeric: tabular-nums; padding: 3px 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #ddd; border-radius: 4px; overflow: hidden; }
figure svg { display: block; width: 100%; height: auto; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: 12px; overflow: auto; font-size: 12px; }
)";

std::string run_name(const std::string& run_dir) {
  fs::path p = fs::absolute(run_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// The planned and measured memory of each level the run trained at ("memory" records).
std::string memory_table(const std::vector<const json*>& records) {
  auto mib = [](const json& r, const char* key) {
    const double v = number(r, key);
    return std::isfinite(v) ? fmt::format("{:.1f} MiB", v / 1048576.0) : std::string("n/a");
  };
  // A run on a device measures the device's peak instead of the arena's host pages.
  const bool device = std::any_of(records.begin(), records.end(), [](const json* r) {
    return (*r)["kind"].get_ref<const std::string&>() == "memory" && r->contains("device_peak");
  });
  std::string rows;
  for (const json* record : records) {
    const json& r = *record;
    if (r["kind"].get_ref<const std::string&>() != "memory") continue;
    rows += fmt::format("<tr><td>{:g}</td><td>O{:g}</td><td>{:g}</td>", number(r, "epoch"), number(r, "level"),
                        number(r, "batch"));
    for (const char* key :
         {"planned_arena", "planned_total", device ? "device_peak" : "arena_high_water", "resident", "peak_resident"})
      rows += "<td>" + mib(r, key) + "</td>";
    rows += "</tr>\n";
  }
  if (rows.empty()) return "<p class=\"nodata\">no memory records yet (written after the first epoch)</p>\n";
  return fmt::format(
      "<table class=\"summary\">\n<tr><th>after epoch</th><th>level</th><th>batch</th><th>planned arena</th>"
      "<th>planned total</th><th>{}</th><th>resident</th><th>peak resident</th></tr>\n{}</table>\n",
      device ? "device peak" : "arena high-water", rows);
}

// The input-pipeline analysis of each epoch ("pipeline" records): loader stage times per
// batch, the data-wait share and the verdict.
std::string pipeline_table(const std::vector<const json*>& records) {
  std::string rows;
  for (const json* record : records) {
    const json& r = *record;
    if (r["kind"].get_ref<const std::string&>() != "pipeline") continue;
    const double batches = std::max(1.0, number(r, "batches"));
    rows += fmt::format("<tr><td>{:g}</td>", number(r, "epoch"));
    for (const char* key : {"read_s", "decode_s", "augment_s", "collate_s", "copy_s", "step_s"})
      rows += fmt::format("<td>{:.2f}</td>", 1e3 * number(r, key) / batches);
    // Figures an older run's records may lack: shown as "-".
    const double other = number(r, "other_s");
    rows += std::isfinite(other) ? fmt::format("<td>{:.2f}</td>", 1e3 * other / batches) : std::string("<td>-</td>");
    const auto count = [&](const char* key) {
      const double v = number(r, key);
      return std::isfinite(v) ? fmt::format("{:g}", v) : std::string("-");
    };
    rows += fmt::format("<td>{:.1f}%</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", 100 * number(r, "wait_share"),
                        count("cache_hits"), count("skipped"), html_escape(text(r, "verdict")));
  }
  if (rows.empty()) return "<p class=\"nodata\">no input-pipeline records yet (written after each epoch)</p>\n";
  return "<p>milliseconds per batch; read, decode, augment and collate run on the loader's workers, copy and step on "
         "the training thread, other is the rest of its loop (gradient monitor, checkpoints, logging)</p>\n"
         "<table class=\"summary\">\n<tr><th>epoch</th><th>read</th><th>decode</th>"
         "<th>augment</th><th>collate</th><th>copy</th><th>step</th><th>other</th><th>data wait</th><th>cache hits</th>"
         "<th>bad files</th><th>verdict</th></tr>\n" +
         rows + "</table>\n";
}

// Data-parallel communication per epoch ("comm" records): all-reduce time per step and the
// share hidden behind backward. Nothing for single-process runs.
std::string comm_table(const std::vector<const json*>& records) {
  std::string rows;
  for (const json* record : records) {
    const json& r = *record;
    if (r["kind"].get_ref<const std::string&>() != "comm") continue;
    rows += fmt::format(
        "<tr><td>{:g}</td><td>{:g}</td><td>{:g}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.0f}%</td>"
        "<td>{:.2f}</td></tr>\n",
        number(r, "epoch"), number(r, "ranks"), number(r, "buckets"), number(r, "bytes_per_step") / 1048576.0,
        number(r, "step_ms"), number(r, "comm_ms"), 100 * number(r, "hidden_share"), number(r, "exposed_ms"));
  }
  if (rows.empty()) return "";
  return "<h2>Communication</h2>\n<p>per training step, averaged over the epoch: the gradient all-reduce (in "
         "buckets, started during backward), the share of it hidden behind backward and what the step waited for "
         "after backward</p>\n<table class=\"summary\">\n<tr><th>epoch</th><th>ranks</th><th>buckets</th>"
         "<th>MiB all-reduced</th><th>step ms</th><th>all-reduce ms</th><th>hidden</th><th>exposed ms</th></tr>\n" +
         rows + "</table>\n";
}

}  // namespace

std::string render_report_html(const std::vector<json>& records, const std::string& config_yaml,
                               const std::string& title) {
  History h = build_history(records);
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n", html_escape(title), kStyle);
  html += fmt::format("<h1>{}</h1>\n<p class=\"sub\">resnet.cpp training report, from metrics.jsonl</p>\n",
                      html_escape(title));
  html += "<h2>Summary</h2>\n";
  if (h.train.empty() && h.eval.empty()) {
    html +=
        "<p class=\"nodata\">no data: metrics.jsonl is missing or holds no training or evaluation records yet</p>\n";
  } else {
    html += summary_table(h);
  }
  html += software_table(h);
  html += "<h2>Input pipeline</h2>\n" + pipeline_table(h.kept);
  html += comm_table(h.kept);
  html += "<h2>Plots</h2>\n" + plots(h);
  html += "<h2>Diagnostics</h2>\n" + diagnostics_section(h);
  html += "<h2>Memory</h2>\n" + memory_table(h.kept);
  html += "<h2>Configuration</h2>\n";
  html += config_yaml.empty() ? "<p>no config.yaml in the run folder</p>\n"
                              : "<pre>" + html_escape(config_yaml) + "</pre>\n";
  return html + "</body>\n</html>\n";
}

void write_report(const std::string& run_dir) {
  std::error_code ec;
  RN_CHECK(fs::is_directory(run_dir, ec)) << "run folder '" << run_dir << "' does not exist";
  const fs::path dir(run_dir);
  const std::string metrics_path = (dir / MetricsLog::kFileName).string();
  std::vector<json> records;
  // A damaged line is left out, not an error: the report must not stop the run it reports.
  if (fs::exists(metrics_path, ec)) records = read_metrics(metrics_path, /*skip_malformed=*/true);
  std::string config;
  if (fs::exists(dir / "config.yaml", ec)) config = read_text_file((dir / "config.yaml").string());
  write_file_atomic((dir / "report.html").string(),
                    render_report_html(records, config, "Training report: " + run_name(run_dir)));
}

}  // namespace rn

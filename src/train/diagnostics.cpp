#include "train/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/log.h"
#include "prof/run_delay.h"

namespace rn {

namespace {

std::unique_ptr<DeviceProbe> make_probe(Device device, const std::string& pci_bus_id) {
  if (device == Device::cuda) {
    std::string why;
    if (auto p = make_nvml_probe(0, &why, pci_bus_id)) return p;
    RN_LOG_INFO("device monitor: {}; GPU power, clocks and temperature are not sampled (CPU only)", why);
  }
  return make_cpu_probe();
}

}  // namespace

TrainDiagnostics::TrainDiagnostics(const Config& cfg, const Model& model, Device device, const std::string& run_dir,
                                   MetricsLog* writer, const std::string& pci_bus_id, int64_t epoch, int64_t step)
    : writer_(writer),
      grads_(model, cfg.diagnostics.grad_monitor_interval, writer ? run_dir + "/grad_summary.jsonl" : ""),
      variance_({.window = static_cast<int>(cfg.diagnostics.variance_window),
                 .threshold = cfg.diagnostics.variance_threshold}) {
  const auto& d = cfg.diagnostics;
  epoch_ = epoch;  // before the device monitor's thread starts sampling
  step_ = step;
  if (d.device_monitor) {
    MetricsLog* log = writer_;
    device_ = std::make_unique<DeviceMonitor>(make_probe(device, pci_bus_id), d.device_monitor_interval,
                                              [log, this](const DeviceSample& s) {
                                                if (!log) return;
                                                MetricsRecord r("device", epoch_.load(), step_.load());
                                                r.add("monitor_time", s.time_s);
                                                nlohmann::json flat = s.fields;
                                                flat.erase("cpu_util_per_core");  // a list: kept out of metrics
                                                r.add_fields(flat);
                                                log->append(r);
                                              });
    RN_LOG_INFO("device monitor: sampling {} every {} s into metrics.jsonl", device_->device_name(),
                d.device_monitor_interval);
  }
  if (d.grad_monitor_interval > 0 && writer_)
    RN_LOG_INFO("gradient monitor: every {} steps into {}/grad_summary.jsonl", d.grad_monitor_interval, run_dir);
}

TrainDiagnostics::~TrainDiagnostics() {
  if (device_) device_->stop();
}

void TrainDiagnostics::begin_epoch(double wait_total, int64_t epoch) {
  epoch_ = epoch;
  last_wait_ = wait_total;
  last_end_ = std::chrono::steady_clock::now();
  last_cpu_wait_ = cpu_wait_seconds();
  pending_ = StepSample{.steps = 0};  // an epoch boundary: steps of the last one are not carried over
}

void TrainDiagnostics::before_step(int64_t step) {
  if (!grads_.due(step)) return;
  const auto t0 = std::chrono::steady_clock::now();
  grads_.before_step(step);  // copies the weights: the monitor's time, not the step's
  between_steps(t0);
}

void TrainDiagnostics::between_steps(std::chrono::steady_clock::time_point since) {
  excluded_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void TrainDiagnostics::after_step(const StepDiagnostics& s) {
  const auto now = std::chrono::steady_clock::now();
  epoch_ = s.epoch;
  step_ = s.step;
  StepSample& sample = pending_;
  sample.seconds += std::chrono::duration<double>(now - last_end_).count() - excluded_;
  excluded_ = 0;
  sample.data_wait += s.wait_total - last_wait_;
  sample.comm += s.comm_seconds;
  sample.host_sync += s.host_sync_seconds;
  sample.images += s.images;
  ++sample.steps;
  if (device_) {
    const DeviceSample d = device_->latest();
    sample.clock_mhz = d.clock_mhz;
    sample.power_w = d.power_w;
  }
  last_end_ = now;
  last_wait_ = s.wait_total;
  std::optional<VarianceWarning> warning;
  if (s.sync_point) {
    // Read once per sync point (a directory of small files): the steps since the last one.
    const double cpu_wait = cpu_wait_seconds();
    const double waited = cpu_wait - last_cpu_wait_;  // NaN where not known
    sample.cpu_wait = std::isnan(waited) ? waited : std::max(0.0, waited);
    last_cpu_wait_ = cpu_wait;
    warning = variance_.add(s.step, sample);
    pending_ = StepSample{.steps = 0};
  }
  if (auto& w = warning) {
    RN_LOG_WARN("{}", w->text);
    if (writer_)
      writer_->append(MetricsRecord("variance_warning", s.epoch, s.step)
                          .add("spread", w->spread)
                          .add("cause", w->cause)
                          .add("evidence", w->evidence));
  }
  if (auto r = grads_.after_step(s.epoch, s.step, s.loss_scale, s.applied); r && writer_) {
    writer_->append(MetricsRecord("grad", s.epoch, s.step).add_fields(grad_metrics_fields(*r)));
    last_end_ = std::chrono::steady_clock::now();  // the monitor's own time is not the next step's
  }
}

void TrainDiagnostics::finish(int64_t epoch, int64_t step) {
  if (device_) device_->stop();
  if (variance_.counted_steps() == 0) return;
  RN_LOG_INFO("throughput: {}", variance_.summary_text());
  if (writer_) {
    nlohmann::json j = variance_.summary_json();
    j.erase("causes");
    writer_->append(MetricsRecord("variance", epoch, step).add_fields(j));
  }
}

}  // namespace rn

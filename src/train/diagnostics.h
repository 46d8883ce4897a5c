// What the trainer runs beside each step for troubleshooting (docs/troubleshooting.md):
// the gradient-distribution monitor, the device monitor and the throughput-variance
// analysis, behind four calls so that the training loop stays readable:
//
//   TrainDiagnostics diag(cfg, model, device, run_dir, &metrics);   // metrics null: not the writer rank
//   diag.begin_epoch(loader.epoch_wait_seconds());
//   diag.before_step(step + 1);  ...step...  diag.after_step({...});
//   diag.finish();                          // logs the variance summary, writes a "variance" record
//
// Only the writer (rank 0 in a distributed run) writes files and records; every rank may
// analyse. Communication and host-sync seconds are filled in by the caller where it knows
// them (0 otherwise).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "model/model.h"
#include "prof/device_monitor.h"
#include "prof/step_variance.h"
#include "train/config.h"
#include "train/grad_monitor.h"
#include "train/metrics.h"

namespace rn {

struct StepDiagnostics {
  int64_t epoch = 0;      // the step's epoch, from 1
  int64_t step = 0;       // 1-based optimizer step just done
  int64_t images = 0;     // samples of the step (this rank)
  double wait_total = 0;  // the loader's epoch_wait_seconds() after the step
  double loss_scale = 1;  // the scale the step used
  bool applied = true;
  double comm_seconds = 0;       // communication not hidden behind compute (distributed runs)
  double host_sync_seconds = 0;  // the host waiting for the device
  // False between host synchronisations (sink mode: the device runs many queued steps per
  // sync, so one step's host time means nothing): such steps are added up and analysed as
  // one sample at the next synchronisation.
  bool sync_point = true;
};

class TrainDiagnostics {
 public:
  // `device` selects the monitor: Device::cuda tries NVML (for the GPU at `pci_bus_id`, the
  // backend's, else NVML's GPU 0), anything else reads /proc. `epoch` (from 1) and `step` (the
  // last one done): where the run starts, which device samples taken before its first step
  // ends are recorded at.
  TrainDiagnostics(const Config& cfg, const Model& model, Device device, const std::string& run_dir, MetricsLog* writer,
                   const std::string& pci_bus_id, int64_t epoch, int64_t step);
  ~TrainDiagnostics();

  // `epoch`: the epoch starting, from 1.
  void begin_epoch(double wait_total, int64_t epoch);
  // Whether the gradient monitor records step `step` (it reads the model's host buffers).
  bool grad_monitor_due(int64_t step) const { return grads_.due(step); }
  void before_step(int64_t step);
  void after_step(const StepDiagnostics& s);
  // Work that is no step's (a periodic checkpoint, the gradient monitor's copy), from `since`
  // until now: left out of the next step's time, which would otherwise read as a slow step.
  void between_steps(std::chrono::steady_clock::time_point since);
  // The variance summary as a log line and a "variance" record.
  void finish(int64_t epoch, int64_t step);

  const StepVarianceAnalyser& variance() const { return variance_; }

 private:
  MetricsLog* writer_;
  GradMonitor grads_;
  StepVarianceAnalyser variance_;
  std::unique_ptr<DeviceMonitor> device_;
  double last_wait_ = 0;
  double last_cpu_wait_ = 0;  // cpu_wait_seconds() at the last sync point (NaN: not known)
  std::chrono::steady_clock::time_point last_end_;
  double excluded_ = 0;                      // seconds the monitors spent inside the current step's interval
  StepSample pending_{.steps = 0};           // steps since the last synchronisation (sink mode)
  std::atomic<int64_t> epoch_{0}, step_{0};  // read by the device monitor's thread
};

}  // namespace rn

// The device monitor: a background thread that samples the device about once a second
// while training runs and hands each sample to a callback (the trainer writes them to
// metrics.jsonl as "device" records; the report plots them).
//
//   GPU  power (W), SM and memory clocks (MHz), temperature (C), GPU and memory-controller
//        utilisation (%), memory used (bytes), clock-event (throttle) reasons, through NVML
//        loaded at run time with dlopen("libnvidia-ml.so.1"): no link-time dependency, and a
//        machine without NVML gets one line saying so while training goes on.
//   CPU  utilisation per core and on average (%, from /proc/stat), the core frequency
//        where the system exposes it (cpufreq in /sys, else "cpu MHz" in /proc/cpuinfo),
//        and the process's resident memory (bytes, /proc/self/statm).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace rn {

struct DeviceSample {
  double time_s = 0;  // seconds since the monitor started
  // Flat fields, in the units named by their suffix (see the header comment):
  //   GPU: power_w, sm_clock_mhz, mem_clock_mhz, temperature_c, gpu_util, mem_util,
  //        mem_used_bytes, mem_total_bytes, clock_event_reasons
  //   CPU: cpu_util, cpu_util_min, cpu_util_max, cpu_mhz (where exposed), rss_bytes,
  //        cpu_util_per_core (a list)
  nlohmann::json fields = nlohmann::json::object();
  // For the variance analysis: the compute clock and the power (NaN when unknown).
  double clock_mhz = std::numeric_limits<double>::quiet_NaN();
  double power_w = std::numeric_limits<double>::quiet_NaN();
};

// One source of samples. sample() is called from the monitor thread only.
class DeviceProbe {
 public:
  virtual ~DeviceProbe() = default;
  virtual std::string name() const = 0;  // "cpu", "gpu 0 (NVIDIA H100 ...)"
  virtual DeviceSample sample() = 0;
};

// /proc and /sys.
std::unique_ptr<DeviceProbe> make_cpu_probe();
// NVML for the GPU at PCI bus id `pci_bus_id` (what CUDA reports for the device a run uses),
// or when that is empty or unknown to NVML, GPU `index` in NVML's numbering (which ignores
// CUDA_VISIBLE_DEVICES); nullptr with *why_not set when NVML or the GPU is not there.
std::unique_ptr<DeviceProbe> make_nvml_probe(unsigned index, std::string* why_not, const std::string& pci_bus_id = "");

class DeviceMonitor {
 public:
  using Callback = std::function<void(const DeviceSample&)>;
  // Takes a sample every `interval_s` seconds on its own thread (the first after one
  // interval), until destroyed or stop().
  DeviceMonitor(std::unique_ptr<DeviceProbe> probe, double interval_s, Callback on_sample);
  ~DeviceMonitor();
  DeviceMonitor(const DeviceMonitor&) = delete;
  DeviceMonitor& operator=(const DeviceMonitor&) = delete;

  void stop();
  DeviceSample latest() const;  // the last sample (empty fields before the first)
  int64_t samples() const { return count_; }
  const std::string& device_name() const { return name_; }

 private:
  void loop();

  std::unique_ptr<DeviceProbe> probe_;
  double interval_s_;
  Callback on_sample_;
  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  DeviceSample latest_;
  std::atomic<int64_t> count_{0};
  std::thread thread_;
};

}  // namespace rn

#include "prof/device_monitor.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/log.h"

namespace rn {

namespace {

// ---- CPU: /proc/stat, cpufreq or /proc/cpuinfo, /proc/self/statm ----

struct CpuTimes {
  uint64_t busy = 0, total = 0;
};

// Per core, in /proc/stat order ("cpu0", "cpu1", ...).
std::vector<CpuTimes> read_proc_stat() {
  std::vector<CpuTimes> cores;
  std::ifstream f("/proc/stat");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line);
    std::string name;
    in >> name;
    uint64_t v[10] = {};
    for (uint64_t& x : v) in >> x;  // user nice system idle iowait irq softirq steal guest guest_nice
    CpuTimes t;
    for (int i = 0; i < 8; ++i) t.total += v[i];  // guest time is already in user
    t.busy = t.total - v[3] - v[4];
    cores.push_back(t);
  }
  return cores;
}

// Mean core frequency in MHz, or NaN when the system does not expose it.
double read_cpu_mhz(size_t cores) {
  double sum = 0;
  size_t n = 0;
  for (size_t c = 0; c < cores; ++c) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cpufreq/scaling_cur_freq");
    double khz = 0;
    if (f >> khz && khz > 0) sum += khz / 1000, ++n;
  }
  if (n > 0) return sum / static_cast<double>(n);
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    sum += std::atof(line.c_str() + colon + 1), ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : std::nan("");
}

int64_t read_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

class CpuProbe : public DeviceProbe {
 public:
  CpuProbe() : last_(read_proc_stat()) {}
  std::string name() const override { return "cpu (" + std::to_string(last_.size()) + " cores)"; }
  DeviceSample sample() override {
    const std::vector<CpuTimes> now = read_proc_stat();
    DeviceSample s;
    std::vector<double> util;
    for (size_t c = 0; c < now.size() && c < last_.size(); ++c) {
      const double total = static_cast<double>(now[c].total - last_[c].total);
      const double busy = static_cast<double>(now[c].busy - last_[c].busy);
      util.push_back(total > 0 ? 100 * busy / total : 0);
    }
    last_ = now;
    if (!util.empty()) {
      double sum = 0, lo = util[0], hi = util[0];
      for (double u : util) sum += u, lo = std::min(lo, u), hi = std::max(hi, u);
      s.fields["cpu_util"] = sum / static_cast<double>(util.size());
      s.fields["cpu_util_min"] = lo;
      s.fields["cpu_util_max"] = hi;
    }
    const double mhz = read_cpu_mhz(now.size());
    if (std::isfinite(mhz)) {
      s.fields["cpu_mhz"] = mhz;
      s.clock_mhz = mhz;
    }
    s.fields["rss_bytes"] = read_rss_bytes();
    s.fields["cpu_util_per_core"] = util;
    return s;
  }

 private:
  std::vector<CpuTimes> last_;
};

// ---- GPU: NVML through dlopen. The few types and signatures we need, as nvml.h declares
// them (NVML's C ABI is stable; the _v2 entry points exist since CUDA 5.5 era drivers). ----

using nvmlReturn_t = int;  // NVML_SUCCESS == 0
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;  // percent of the last sample period
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
constexpr int kNvmlClockSm = 1, kNvmlClockMem = 2;  // nvmlClockType_t
constexpr int kNvmlTemperatureGpu = 0;              // nvmlTemperatureSensors_t

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;  // optional
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;  // milliwatts
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;  // optional
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long*) = nullptr;  // optional
};

template <typename F>
bool load_symbol(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

class NvmlProbe : public DeviceProbe {
 public:
  NvmlProbe(Nvml nvml, nvmlDevice_t dev, std::string name) : nvml_(nvml), dev_(dev), name_(std::move(name)) {}
  ~NvmlProbe() override {
    nvml_.shutdown();
    dlclose(nvml_.lib);
  }
  std::string name() const override { return name_; }
  DeviceSample sample() override {
    DeviceSample s;
    unsigned int v = 0;
    if (nvml_.power(dev_, &v) == 0) s.fields["power_w"] = s.power_w = v / 1000.0;
    if (nvml_.clock(dev_, kNvmlClockSm, &v) == 0) s.fields["sm_clock_mhz"] = s.clock_mhz = v;
    if (nvml_.clock(dev_, kNvmlClockMem, &v) == 0) s.fields["mem_clock_mhz"] = v;
    if (nvml_.temperature && nvml_.temperature(dev_, kNvmlTemperatureGpu, &v) == 0) s.fields["temperature_c"] = v;
    nvmlUtilization_t u{};
    if (nvml_.utilization(dev_, &u) == 0) {
      s.fields["gpu_util"] = u.gpu;
      s.fields["mem_util"] = u.memory;
    }
    nvmlMemory_t m{};
    if (nvml_.memory(dev_, &m) == 0) {
      s.fields["mem_used_bytes"] = m.used;
      s.fields["mem_total_bytes"] = m.total;
    }
    unsigned long long reasons = 0;
    if (nvml_.throttle && nvml_.throttle(dev_, &reasons) == 0) s.fields["clock_event_reasons"] = reasons;
    return s;
  }

 private:
  Nvml nvml_;
  nvmlDevice_t dev_;
  std::string name_;
};

}  // namespace

std::unique_ptr<DeviceProbe> make_cpu_probe() { return std::make_unique<CpuProbe>(); }

std::unique_ptr<DeviceProbe> make_nvml_probe(unsigned index, std::string* why_not, const std::string& pci_bus_id) {
  Nvml n;
  for (const char* so : {"libnvidia-ml.so.1", "libnvidia-ml.so"})
    if ((n.lib = dlopen(so, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (!n.lib) {
    const char* err = dlerror();  // reading it clears it: once
    *why_not = "NVML (libnvidia-ml.so.1) not found: " + std::string(err ? err : "no such library");
    return nullptr;
  }
  const bool ok = load_symbol(n.lib, "nvmlInit_v2", n.init) && load_symbol(n.lib, "nvmlShutdown", n.shutdown) &&
                  load_symbol(n.lib, "nvmlErrorString", n.error_string) &&
                  load_symbol(n.lib, "nvmlDeviceGetHandleByIndex_v2", n.handle_by_index) &&
                  load_symbol(n.lib, "nvmlDeviceGetName", n.name) &&
                  load_symbol(n.lib, "nvmlDeviceGetPowerUsage", n.power) &&
                  load_symbol(n.lib, "nvmlDeviceGetClockInfo", n.clock) &&
                  load_symbol(n.lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
                  load_symbol(n.lib, "nvmlDeviceGetMemoryInfo", n.memory);
  if (!ok) {
    *why_not = "NVML is missing a function this monitor needs (driver too old?)";
    dlclose(n.lib);
    return nullptr;
  }
  // Deprecated in newer drivers (nvmlDeviceGetTemperatureV): a sample without it still counts.
  load_symbol(n.lib, "nvmlDeviceGetTemperature", n.temperature);
  load_symbol(n.lib, "nvmlDeviceGetCurrentClocksEventReasons", n.throttle) ||
      load_symbol(n.lib, "nvmlDeviceGetCurrentClocksThrottleReasons", n.throttle);
  if (const nvmlReturn_t r = n.init(); r != 0) {
    *why_not = std::string("nvmlInit failed: ") + n.error_string(r);
    dlclose(n.lib);
    return nullptr;
  }
  nvmlDevice_t dev = nullptr;
  std::string which = "gpu " + std::to_string(index);
  if (!pci_bus_id.empty() && load_symbol(n.lib, "nvmlDeviceGetHandleByPciBusId_v2", n.handle_by_pci_bus_id) &&
      n.handle_by_pci_bus_id(pci_bus_id.c_str(), &dev) == 0) {
    which = "gpu " + pci_bus_id;
  } else if (const nvmlReturn_t r = n.handle_by_index(index, &dev); r != 0) {
    *why_not = "NVML has no GPU " + std::to_string(index) + ": " + n.error_string(r);
    n.shutdown();
    dlclose(n.lib);
    return nullptr;
  }
  char name[96] = {};
  n.name(dev, name, sizeof name);
  return std::make_unique<NvmlProbe>(n, dev, which + " (" + name + ")");
}

DeviceMonitor::DeviceMonitor(std::unique_ptr<DeviceProbe> probe, double interval_s, Callback on_sample)
    : probe_(std::move(probe)), interval_s_(interval_s), on_sample_(std::move(on_sample)) {
  RN_CHECK(probe_) << "device monitor: no probe";
  RN_CHECK(interval_s_ > 0) << "device monitor: interval must be positive, got " << interval_s_;
  name_ = probe_->name();
  thread_ = std::thread([this] { loop(); });
}

DeviceMonitor::~DeviceMonitor() { stop(); }

void DeviceMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

DeviceSample DeviceMonitor::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void DeviceMonitor::loop() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto interval =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(interval_s_));
  auto next = t0 + interval;  // the first sample covers a whole interval (utilisation is a rate)
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (cv_.wait_until(lock, next, [this] { return stop_; })) break;
    lock.unlock();
    DeviceSample s;
    try {
      s = probe_->sample();
    } catch (const std::exception& e) {
      RN_LOG_WARN("device monitor: sampling {} failed ({}); monitor stopped", name_, e.what());
      return;
    }
    s.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The callback writes a record (metrics.jsonl): a full disk or a file-size limit must not
    // escape this thread (std::terminate, no checkpoint). The monitor stops; the trainer's own
    // next write meets the same error and ends the run with it.
    if (on_sample_) {
      try {
        on_sample_(s);
      } catch (const std::exception& e) {
        RN_LOG_WARN("device monitor: recording a sample of {} failed ({}); monitor stopped", name_, e.what());
        return;
      }
    }
    lock.lock();
    latest_ = s;
    ++count_;
    next += interval;
  }
}

}  // namespace rn

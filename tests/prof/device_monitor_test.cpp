// The device monitor: the CPU probe reads /proc, NVML's absence is a message (not an
// error), and the monitor thread hands samples to its callback until stopped.
#include "prof/device_monitor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/check.h"

namespace rn {
namespace {

TEST(DeviceMonitor, CpuProbeReadsUtilisationAndResidentMemory) {
  auto probe = make_cpu_probe();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const DeviceSample s = probe->sample();
  ASSERT_TRUE(s.fields.contains("cpu_util"));
  const double util = s.fields["cpu_util"].get<double>();
  EXPECT_GE(util, 0.0);
  EXPECT_LE(util, 100.0);
  EXPECT_GE(s.fields["cpu_util_max"].get<double>(), s.fields["cpu_util_min"].get<double>());
  EXPECT_EQ(s.fields["cpu_util_per_core"].size(), std::thread::hardware_concurrency());
  EXPECT_GT(s.fields["rss_bytes"].get<int64_t>(), 1 << 20);
}

TEST(DeviceMonitor, MissingNvmlIsAMessage) {
  std::string why;
  auto p = make_nvml_probe(0, &why);
  if (p) GTEST_SKIP() << "this machine has NVML: " << p->name();
  EXPECT_FALSE(why.empty());
  EXPECT_NE(why.find("NVML"), std::string::npos) << why;
}

class CountingProbe : public DeviceProbe {
 public:
  std::string name() const override { return "counting"; }
  DeviceSample sample() override {
    DeviceSample s;
    s.clock_mhz = 1000 + n_++;
    s.fields["n"] = n_;
    return s;
  }

 private:
  int n_ = 0;
};

TEST(DeviceMonitor, SamplesUntilStopped) {
  std::atomic<int> calls{0};
  DeviceMonitor m(std::make_unique<CountingProbe>(), 0.01, [&](const DeviceSample& s) {
    EXPECT_GT(s.time_s, 0.0);
    ++calls;
  });
  EXPECT_EQ(m.device_name(), "counting");
  for (int i = 0; i < 200 && m.samples() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.stop();
  const int64_t n = m.samples();
  EXPECT_GE(n, 3);
  EXPECT_EQ(calls.load(), n);
  EXPECT_EQ(m.latest().clock_mhz, 1000 + n - 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(m.samples(), n) << "no samples after stop()";
  EXPECT_THROW(DeviceMonitor(std::make_unique<CountingProbe>(), 0, nullptr), Error);
}

// A callback that throws (its record's write failed: a full disk) stops the monitor with a
// warning; it used to escape the thread and end the process through std::terminate.
TEST(DeviceMonitor, ACallbackThatThrowsStopsTheMonitorNotTheProcess) {
  std::atomic<int> calls{0};
  DeviceMonitor m(std::make_unique<CountingProbe>(), 0.01, [&](const DeviceSample&) {
    ++calls;
    RN_FAIL() << "cannot write to 'metrics.jsonl': No space left on device";
  });
  for (int i = 0; i < 100 && calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 1) << "the monitor stops at the first failure";
  EXPECT_EQ(m.samples(), 0);
  m.stop();
}

}  // namespace
}  // namespace rn

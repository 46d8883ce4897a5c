// The throughput-variance analysis on synthetic step samples: silent on a steady run (and
// on a lone slow step), and naming the cause of a slow stretch from its evidence.
#include "prof/step_variance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/check.h"

namespace rn {
namespace {

// Deterministic jitter of +-3% around `base`.
double jitter(int i, double base) { return base * (1.0 + 0.03 * std::sin(1.7 * i)); }

std::vector<VarianceWarning> feed(StepVarianceAnalyser& v, const std::vector<StepSample>& samples) {
  std::vector<VarianceWarning> w;
  for (size_t i = 0; i < samples.size(); ++i)
    if (auto x = v.add(static_cast<int64_t>(i + 1), samples[i])) w.push_back(*x);
  return w;
}

std::vector<StepSample> steady(int n) {
  std::vector<StepSample> s;
  for (int i = 0; i < n; ++i) s.push_back({.seconds = jitter(i, 0.1), .data_wait = 0.001, .images = 32});
  return s;
}

TEST(StepVariance, SteadyRunIsSilent) {
  StepVarianceAnalyser v({.window = 50, .threshold = 0.10});
  const auto samples = steady(400);
  EXPECT_TRUE(feed(v, samples).empty());
  EXPECT_LT(v.window_spread(), 0.05);
  // The throughput CV over the counted steps (after 5 warm-up steps), by hand.
  double mean = 0, m2 = 0;
  std::vector<double> tp;
  for (size_t i = 5; i < samples.size(); ++i) tp.push_back(32 / samples[i].seconds);
  for (double t : tp) mean += t;
  mean /= static_cast<double>(tp.size());
  for (double t : tp) m2 += (t - mean) * (t - mean);
  const double cv = std::sqrt(m2 / static_cast<double>(tp.size() - 1)) / mean;
  EXPECT_NEAR(v.throughput_cv(), cv, 1e-9);
  EXPECT_EQ(v.counted_steps(), 395);
  EXPECT_NE(v.summary_text().find("no variance warnings"), std::string::npos);
}

TEST(StepVariance, OneSlowStepIsNotVariance) {
  StepVarianceAnalyser v({.window = 50, .threshold = 0.10});
  auto samples = steady(200);
  samples[120].seconds = 0.5;  // a checkpoint, an epoch start
  samples[120].data_wait = 0.4;
  EXPECT_TRUE(feed(v, samples).empty());
}

TEST(StepVariance, SlowLoaderStretchIsInputBound) {
  StepVarianceAnalyser v({.window = 50, .threshold = 0.10});
  auto samples = steady(300);
  for (int i = 150; i < 180; ++i) {
    samples[i].data_wait = 0.08;
    samples[i].seconds = jitter(i, 0.1) + 0.08;
  }
  const auto w = feed(v, samples);
  ASSERT_EQ(w.size(), 1u) << "one warning for the stretch";
  EXPECT_EQ(w[0].cause, "input-bound");
  EXPECT_GT(w[0].step, 150);
  EXPECT_LT(w[0].step, 185);
  EXPECT_NE(w[0].text.find("likely cause: input-bound"), std::string::npos) << w[0].text;
  EXPECT_NE(w[0].evidence.find("data-wait share"), std::string::npos);
  EXPECT_EQ(v.warnings(), 1);
  EXPECT_EQ(v.summary_json()["causes"]["input-bound"], 1);
}

TEST(StepVariance, ClockDropIsNamed) {
  StepVarianceAnalyser v({.window = 40, .threshold = 0.10});
  auto samples = steady(200);
  for (auto& s : samples) s.clock_mhz = 1980, s.power_w = 690;
  for (int i = 100; i < 130; ++i) {
    samples[i].clock_mhz = 1200;
    samples[i].power_w = 400;
    samples[i].seconds = jitter(i, 0.1) * 1980 / 1200;
  }
  const auto w = feed(v, samples);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w[0].cause, "clocks or power");
  EXPECT_NE(w[0].evidence.find("1980 MHz"), std::string::npos) << w[0].evidence;
}

TEST(StepVariance, CommunicationAndHostSyncAreNamed) {
  for (int which = 0; which < 2; ++which) {
    StepVarianceAnalyser v({.window = 40, .threshold = 0.10});
    auto samples = steady(200);
    for (int i = 100; i < 130; ++i) {
      (which == 0 ? samples[i].comm : samples[i].host_sync) = 0.05;
      samples[i].seconds += 0.05;
    }
    const auto w = feed(v, samples);
    ASSERT_FALSE(w.empty());
    EXPECT_EQ(w[0].cause, which == 0 ? "communication" : "host synchronisation");
    // Communication's evidence says that its time includes waiting for a slower rank.
    EXPECT_EQ(w[0].evidence.find("also waits for the slowest rank") != std::string::npos, which == 0) << w[0].evidence;
  }
}

// On a device (eager steps) the host waits for every step's results: its host-sync time is
// the device computing, ~99% of every step. A slower device stretch is not "host
// synchronisation" (the share did not grow): a clock drop is named as such, else compute.
TEST(StepVariance, DeviceStepsWhoseHostWaitsForTheComputeAreNotHostSync) {
  for (const bool clocks : {true, false}) {
    SCOPED_TRACE(clocks ? "clock drop" : "no clock figures");
    StepVarianceAnalyser v({.window = 40, .threshold = 0.10});
    auto samples = steady(200);
    for (int i = 0; i < 200; ++i) {
      if (i >= 100 && i < 130) samples[i].seconds *= 1.6;
      samples[i].host_sync = 0.99 * samples[i].seconds;
      samples[i].data_wait = 0.001;
      if (clocks) samples[i].clock_mhz = i >= 100 && i < 130 ? 1980 / 1.6 : 1980;
    }
    const auto w = feed(v, samples);
    ASSERT_FALSE(w.empty());
    EXPECT_EQ(w[0].cause, clocks ? "clocks or power" : "compute") << w[0].text;
  }
}

// Sink mode: a sample covers the steps since the last host synchronisation. The mean step time
// is per step (it was per synchronisation, sink_size times the step) and the summary counts steps.
TEST(StepVariance, SinkModeSamplesAreTakenPerStep) {
  StepVarianceAnalyser v({.window = 11, .threshold = 0.10});
  std::vector<StepSample> samples(40, StepSample{.seconds = 0.4, .images = 128, .steps = 4});
  EXPECT_TRUE(feed(v, samples).empty());
  EXPECT_NEAR(v.mean_step_seconds(), 0.1, 1e-12);
  EXPECT_EQ(v.summary_json()["steps"], 35 * 4);
  EXPECT_EQ(v.summary_json()["samples"], 35);
  EXPECT_NE(v.summary_text().find("step time 100.0 ms mean"), std::string::npos) << v.summary_text();
  EXPECT_NE(v.summary_text().find("over 140 steps in 35 host synchronisations"), std::string::npos) << v.summary_text();
}

// Steps stretched while the process's threads waited for a core: the cores were taken.
TEST(StepVariance, StretchWaitingForCoresIsCpuContention) {
  StepVarianceAnalyser v({.window = 40, .threshold = 0.10});
  auto samples = steady(200);
  for (auto& s : samples) s.cpu_wait = 0.001;
  for (int i = 100; i < 130; ++i) {
    samples[i].seconds *= 1.6;
    samples[i].cpu_wait = 0.12;  // two threads, each 60 ms behind
  }
  const auto w = feed(v, samples);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w[0].cause, "CPU contention");
  EXPECT_NE(w[0].evidence.find("waited 1.0 ms per step for a core in the fastest half vs "), std::string::npos)
      << w[0].evidence;
  // Slightly longer waits than a steady step's do not explain a 60% stretch.
  StepVarianceAnalyser quiet({.window = 40, .threshold = 0.10});
  for (int i = 100; i < 130; ++i) samples[i].cpu_wait = 0.004;
  const auto q = feed(quiet, samples);
  ASSERT_FALSE(q.empty());
  EXPECT_EQ(q[0].cause, "compute");
}

TEST(StepVariance, UnexplainedSpreadIsCompute) {
  StepVarianceAnalyser v({.window = 40, .threshold = 0.10});
  auto samples = steady(200);
  for (int i = 100; i < 130; ++i) samples[i].seconds *= 1.6;
  const auto w = feed(v, samples);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w[0].cause, "compute");
}

TEST(StepVariance, RobustCvHandComputed) {
  // 0..10: P10 = 1, P50 = 5, P90 = 9: (9 - 1) / (2.563 * 5).
  std::vector<double> v;
  for (int i = 0; i <= 10; ++i) v.push_back(i);
  EXPECT_NEAR(robust_cv(v), 8.0 / (2.563 * 5.0), 1e-12);
  EXPECT_EQ(robust_cv({1.0, 2.0}), 0.0);
}

TEST(StepVariance, BadOptionsAreErrors) {
  EXPECT_THROW(StepVarianceAnalyser({.window = 2}), Error);
  EXPECT_THROW(StepVarianceAnalyser({.window = 50, .threshold = 0}), Error);
}

}  // namespace
}  // namespace rn

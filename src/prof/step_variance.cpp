#include "prof/step_variance.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

namespace rn {

namespace {

double quantile_sorted(const std::vector<double>& v, double q) {
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

// Mean of a field over some samples.
template <typename F>
double mean_of(const std::vector<const StepSample*>& s, F field) {
  double sum = 0;
  int n = 0;
  for (const StepSample* x : s) {
    const double v = field(*x);
    if (std::isfinite(v)) sum += v, ++n;
  }
  return n > 0 ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

double robust_cv(std::vector<double> v) {
  if (v.size() < 3) return 0;
  std::sort(v.begin(), v.end());
  const double median = quantile_sorted(v, 0.5);
  if (median <= 0) return 0;
  return (quantile_sorted(v, 0.9) - quantile_sorted(v, 0.1)) / (2.563 * median);
}

StepVarianceAnalyser::StepVarianceAnalyser(VarianceOptions options) : options_(options) {
  // P90 interpolates at 0.9 (n - 1): below 11 samples it reaches into the slowest one, and a
  // lone slow step (a checkpoint) would count as spread.
  RN_CHECK(options_.window >= 11) << "variance analysis: window of " << options_.window
                                  << " steps is too short (11 or more)";
  RN_CHECK(options_.threshold > 0) << "variance analysis: threshold must be positive, got " << options_.threshold;
}

std::optional<VarianceWarning> StepVarianceAnalyser::add(int64_t step, const StepSample& sample) {
  if (++seen_ <= options_.warmup || !(sample.seconds > 0)) return std::nullopt;
  ++count_;
  const double tp = sample.images > 0 ? static_cast<double>(sample.images) / sample.seconds : 1.0 / sample.seconds;
  const double d = tp - tp_mean_;
  tp_mean_ += d / static_cast<double>(count_);
  tp_m2_ += d * (tp - tp_mean_);
  sec_sum_ += sample.seconds;
  steps_ += std::max<int64_t>(1, sample.steps);
  // The window holds per-step figures: a sink-mode sample covers several steps.
  StepSample s = sample;
  if (sample.steps > 1) {
    const double k = static_cast<double>(sample.steps);
    for (double* v : {&s.seconds, &s.data_wait, &s.comm, &s.host_sync, &s.cpu_wait}) *v /= k;
    s.steps = 1;
  }
  window_.push_back(s);
  if (window_.size() > static_cast<size_t>(options_.window)) window_.pop_front();
  if (window_.size() < static_cast<size_t>(options_.window)) return std::nullopt;
  const double spread = window_spread();
  max_spread_ = std::max(max_spread_, spread);
  if (spread < 0.8 * options_.threshold) {
    // Calm for a whole window: the next spread is a new episode. (A window that is briefly
    // all slow, in the middle of a slow stretch, is not calm enough to warn again when the
    // stretch ends.)
    if (++calm_steps_ >= options_.window) episode_causes_.clear();
    return std::nullopt;
  }
  calm_steps_ = 0;
  if (spread <= options_.threshold) return std::nullopt;
  VarianceWarning w = explain(step, spread);
  // One warning per cause and episode: a second cause within the same spread (a slow loader
  // on top of a noisy machine) still gets its line.
  if (std::find(episode_causes_.begin(), episode_causes_.end(), w.cause) != episode_causes_.end()) return std::nullopt;
  episode_causes_.push_back(w.cause);
  ++warnings_;
  causes_[w.cause] = causes_.value(w.cause, 0) + 1;
  return w;
}

double StepVarianceAnalyser::window_spread() const {
  if (window_.size() < static_cast<size_t>(options_.window)) return 0;
  std::vector<double> t;
  for (const StepSample& s : window_) t.push_back(s.seconds);
  return robust_cv(std::move(t));
}

VarianceWarning StepVarianceAnalyser::explain(int64_t step, double spread) const {
  std::vector<const StepSample*> sorted;
  for (const StepSample& s : window_) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->seconds < b->seconds; });
  const size_t n = sorted.size();
  const std::vector<const StepSample*> fast(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n / 2));
  const std::vector<const StepSample*> slow(sorted.end() - static_cast<std::ptrdiff_t>(std::max<size_t>(1, n / 4)),
                                            sorted.end());
  auto sec = [](const StepSample& s) { return s.seconds; };
  const double t_fast = mean_of(fast, sec), t_slow = mean_of(slow, sec);
  const double extra = t_slow - t_fast;
  struct Candidate {
    const char* cause;
    double seconds;
    std::string evidence;
  };
  std::vector<Candidate> c;
  // `beyond_stretch`: only growth beyond the step's own stretch counts (a larger share).
  auto share = [&](auto field, const char* cause, const char* what, const char* note = "",
                   bool beyond_stretch = false) {
    const double f = mean_of(fast, field), s = mean_of(slow, field);
    c.push_back({cause, s - f * (beyond_stretch ? t_slow / t_fast : 1.0),
                 fmt::format("{} {:.1f}% of the step in the fastest half vs {:.1f}% in the slowest quarter "
                             "({:+.1f} ms per step{})",
                             what, 100 * f / t_fast, 100 * s / t_slow, 1e3 * (s - f), note)});
  };
  share([](const StepSample& s) { return s.data_wait; }, "input-bound", "data-wait share");
  // An all-reduce ends when the slowest rank has joined it: its time includes waiting for a
  // rank that is behind (starved of a core, a slow loader), not only the network.
  share([](const StepSample& s) { return s.comm; }, "communication", "communication share",
        "; an all-reduce also waits for the slowest rank: compare the ranks' step times");
  // On a device the host's wait for a step's results is mostly the device computing it (eager
  // steps wait for every step), so it grows with any slower step: only a larger share counts.
  share([](const StepSample& s) { return s.host_sync; }, "host synchronisation", "host-sync share", "",
        /*beyond_stretch=*/true);
  // The step's own work: what the host did and what it waited for the device to do (on a device
  // the host's waits are the device's compute), less data waits and exposed communication.
  const auto work = [](const StepSample& s) { return s.seconds - s.data_wait - s.comm; };
  {
    const double cf = mean_of(fast, [](const StepSample& s) { return s.clock_mhz; });
    const double cs = mean_of(slow, [](const StepSample& s) { return s.clock_mhz; });
    const double pf = mean_of(fast, [](const StepSample& s) { return s.power_w; });
    const double ps = mean_of(slow, [](const StepSample& s) { return s.power_w; });
    if (std::isfinite(cf) && std::isfinite(cs) && cs < 0.97 * cf) {
      // The compute part of the slow steps, stretched by the clock ratio.
      const double compute_slow = mean_of(slow, work);
      std::string ev = fmt::format("clock {:.0f} MHz in the fastest half vs {:.0f} MHz in the slowest quarter", cf, cs);
      if (std::isfinite(pf) && std::isfinite(ps)) ev += fmt::format(", power {:.0f} W vs {:.0f} W", pf, ps);
      c.push_back({"clocks or power", compute_slow * (1 - cs / cf), ev});
    }
  }
  {
    // A thread waiting for a core stalls the whole step (each parallel region waits for its
    // slowest thread), so a stretch whose threads waited far longer lost its time to others.
    const double wf = mean_of(fast, [](const StepSample& s) { return s.cpu_wait; });
    const double ws = mean_of(slow, [](const StepSample& s) { return s.cpu_wait; });
    const double stretch = mean_of(slow, work) - mean_of(fast, work);
    if (std::isfinite(wf) && std::isfinite(ws) && stretch > 0 && ws - wf > 0.3 * stretch)
      c.push_back({"CPU contention", stretch,
                   fmt::format("the process's threads waited {:.1f} ms per step for a core in the fastest half vs "
                               "{:.1f} ms in the slowest quarter: more runnable threads than cores (other "
                               "processes, or run.threads plus data.workers beyond the cores); give run.threads no "
                               "more than the idle cores (OpenMP: OMP_WAIT_POLICY=passive stops waiting threads "
                               "from spinning on a shared machine)",
                               1e3 * wf, 1e3 * ws)});
  }
  const auto best = std::max_element(c.begin(), c.end(), [](auto& a, auto& b) { return a.seconds < b.seconds; });
  VarianceWarning w;
  w.step = step;
  w.spread = spread;
  if (best != c.end() && best->seconds > 0.3 * extra && best->seconds > 0) {
    w.cause = best->cause;
    w.evidence = best->evidence;
  } else {
    w.cause = "compute";
    w.evidence = fmt::format(
        "data wait, communication, host sync, clocks and waits for a core do not explain it: the step itself took "
        "{:.1f} ms in the slowest quarter vs {:.1f} ms in the fastest half",
        1e3 * t_slow, 1e3 * t_fast);
  }
  w.text = fmt::format(
      "throughput variance: step time spread {:.1f}% (threshold {:.0f}%) over the last {} steps at step {}; "
      "likely cause: {}: {}; slowest quarter {:.1f} ms vs fastest half {:.1f} ms per step",
      100 * spread, 100 * options_.threshold, window_.size(), step, w.cause, w.evidence, 1e3 * t_slow, 1e3 * t_fast);
  return w;
}

double StepVarianceAnalyser::throughput_cv() const {
  if (count_ < 2 || tp_mean_ <= 0) return 0;
  return std::sqrt(tp_m2_ / static_cast<double>(count_ - 1)) / tp_mean_;
}

double StepVarianceAnalyser::mean_step_seconds() const {
  return steps_ > 0 ? sec_sum_ / static_cast<double>(steps_) : 0;
}

nlohmann::json StepVarianceAnalyser::summary_json() const {
  return {{"steps", steps_},
          {"samples", count_},
          {"mean_step_s", mean_step_seconds()},
          {"throughput_cv", throughput_cv()},
          {"max_window_spread", max_spread_},
          {"warnings", warnings_},
          {"causes", causes_}};
}

std::string StepVarianceAnalyser::summary_text() const {
  std::string causes;
  for (const auto& [k, v] : causes_.items())
    causes += fmt::format("{}{} x{}", causes.empty() ? "" : ", ", k, v.get<int64_t>());
  // Sink mode: one sample per host synchronisation, so the window counts synchronisations.
  const bool per_sync = steps_ != count_;
  const char* unit = per_sync ? "synchronisation" : "step";
  const std::string spread = count_ >= options_.window
                                 ? fmt::format("largest {}-{} spread {:.1f}%", options_.window, unit, 100 * max_spread_)
                                 : fmt::format("too few {}s for the {}-{} window", unit, options_.window, unit);
  return fmt::format("step time {:.1f} ms mean, throughput CV {:.1f}% over {} steps{} ({}); {}",
                     1e3 * mean_step_seconds(), 100 * throughput_cv(), steps_,
                     per_sync ? fmt::format(" in {} host synchronisations", count_) : std::string(), spread,
                     warnings_ == 0 ? std::string("no variance warnings")
                                    : fmt::format("{} variance warning(s): {}", warnings_, causes));
}

}  // namespace rn

#include "train/run_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/check.h"
#include "core/plural.h"
#include "train/config.h"

namespace rn {

namespace {

double rel_diff(double a, double b) {
  const double m = std::max(std::fabs(a), std::fabs(b));
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b ? 0 : INFINITY;
  return m > 0 ? std::fabs(a - b) / m : 0;
}

}  // namespace

std::string grad_summary_path(const std::string& run) {
  namespace fs = std::filesystem;
  RN_CHECK(fs::exists(run)) << "'" << run << "' does not exist: name a run folder or its grad_summary.jsonl";
  const fs::path p = fs::is_directory(run) ? fs::path(run) / "grad_summary.jsonl" : fs::path(run);
  if (!fs::exists(p)) {
    // A run that monitors gradients but stopped before its first monitored step has none yet:
    // its config says which.
    int64_t interval = 0;
    if (fs::is_directory(run) && fs::exists(fs::path(run) / "config.yaml")) {
      try {
        interval = load_config((fs::path(run) / "config.yaml").string()).diagnostics.grad_monitor_interval;
      } catch (const Error&) {  // unreadable: the general advice below
      }
    }
    RN_CHECK(interval <= 0) << "no gradient summary at '" << p.string() << "': the run monitors gradients every "
                            << interval
                            << " steps (diagnostics.grad_monitor_interval) but wrote no summary yet: it stopped "
                               "before its first monitored step";
    RN_FAIL() << "no gradient summary at '" << p.string()
              << "': the run did not monitor gradients (set diagnostics.grad_monitor_interval > 0)";
  }
  return p.string();
}

std::vector<GradRecord> grad_records_by_step(const std::vector<GradRecord>& records) {
  std::map<int64_t, const GradRecord*> by_step;
  for (const GradRecord& r : records) by_step[r.step] = &r;
  std::vector<GradRecord> out;
  for (const auto& [step, r] : by_step) out.push_back(*r);
  return out;
}

RunComparison compare_grad_runs(const std::vector<GradRecord>& a_in, const std::vector<GradRecord>& b_in,
                                double tolerance) {
  const std::vector<GradRecord> a = grad_records_by_step(a_in), b = grad_records_by_step(b_in);
  std::map<int64_t, const GradRecord*> b_at;
  for (const GradRecord& r : b) b_at[r.step] = &r;
  RunComparison c;
  c.tolerance = tolerance;
  for (const GradRecord& ra : a) c.common_steps += b_at.count(ra.step);
  bool first_common = true;
  int64_t agreed_step = -1;  // the last common step at which the runs agreed
  for (const GradRecord& ra : a) {
    auto it = b_at.find(ra.step);
    if (it == b_at.end()) continue;
    const GradRecord& rb = *it->second;
    const bool at_first_common = first_common;
    first_common = false;
    RN_CHECK(ra.layers.size() == rb.layers.size()) << "summary: the runs have different models (" << ra.layers.size()
                                                   << " vs " << rb.layers.size() << " parameter tensors)";
    std::vector<TensorDivergence> d;
    for (size_t i = 0; i < ra.layers.size(); ++i) {
      const LayerGradStats& x = ra.layers[i];
      const LayerGradStats& y = rb.layers[i];
      RN_CHECK(x.name == y.name) << "summary: the runs have different models: tensor " << i << " is '" << x.name
                                 << "' in one run and '" << y.name << "' in the other";
      RN_CHECK(x.grad.numel == y.grad.numel)
          << "summary: the runs have different models: '" << x.name << "' holds " << x.grad.numel
          << " values in one run and " << y.grad.numel << " in the other (another width, class count or input?)";
      TensorDivergence t{x.name,
                         x.weight_norm,
                         y.weight_norm,
                         rel_diff(x.weight_norm, y.weight_norm),
                         x.grad.norm(),
                         y.grad.norm(),
                         rel_diff(x.grad.norm(), y.grad.norm())};
      d.push_back(t);
    }
    const bool any =
        std::any_of(d.begin(), d.end(), [&](auto& t) { return t.weight_rel > tolerance || t.grad_rel > tolerance; });
    if (!any) {
      agreed_step = ra.step;
      continue;
    }
    c.first_step = ra.step;
    // Weights that differ at the first common step (step 1: the initial weights) are where the
    // runs started apart. Weights (taken before the step's update) that differ right after a
    // step at which weights and gradients agreed were moved apart by that step's update:
    // another learning rate, momentum or weight decay, or a step one run skipped; the
    // gradients then differ because the weights do. With unmonitored steps between, earlier
    // gradient differences may be the cause: the gradients lead.
    const bool weights_apart = std::any_of(d.begin(), d.end(), [&](auto& t) { return t.weight_rel > tolerance; });
    c.updates_differ = weights_apart && !at_first_common && agreed_step == ra.step - 1;
    const bool weights = weights_apart && (at_first_common || c.updates_differ);
    std::stable_sort(d.begin(), d.end(), [&](const TensorDivergence& x, const TensorDivergence& y) {
      return weights ? x.weight_rel > y.weight_rel : x.grad_rel > y.grad_rel;
    });
    c.first_reason = weights ? "weights" : "gradients";
    c.first_tensor = d.front().name;
    d.resize(std::min<size_t>(d.size(), 10));
    c.worst = std::move(d);
    break;
  }
  return c;
}

std::string RunComparison::text() const {
  if (common_steps == 0)
    return "no step was monitored in both runs: nothing to compare (same grad_monitor_interval?)\n";
  if (first_step < 0)
    return fmt::format("the runs agree: weight and gradient norms of every tensor within {:g} at {}\n", tolerance,
                       common_steps == 1 ? std::string("the one common monitored step")
                                         : fmt::format("all {} common monitored steps", common_steps));
  std::string s =
      fmt::format("first divergence at step {} (tolerance {:g}, {}): {} of {} differ first{}\n\n", first_step,
                  tolerance, counted(common_steps, "common monitored step"), first_reason, first_tensor,
                  updates_differ ? fmt::format(", after step {} agreed: its updates differed (learning "
                                               "rate, momentum, weight decay, or a step one run skipped)",
                                               first_step - 1)
                                 : std::string());
  s += fmt::format("{:<36} {:>11} {:>11} {:>9} {:>11} {:>11} {:>9}\n", "tensor", "|w| run A", "|w| run B", "rel",
                   "|g| run A", "|g| run B", "rel");
  for (const TensorDivergence& t : worst)
    s += fmt::format("{:<36} {:>11.4e} {:>11.4e} {:>9.2e} {:>11.4e} {:>11.4e} {:>9.2e}\n", t.name, t.weight_a,
                     t.weight_b, t.weight_rel, t.grad_a, t.grad_b, t.grad_rel);
  return s;
}

std::string summarize_grad_run(const std::vector<GradRecord>& all) {
  const std::vector<GradRecord> records = grad_records_by_step(all);
  RN_CHECK(!records.empty()) << "summary: the gradient summary holds no records";
  std::vector<const GradRecord*> first_epoch;
  for (const GradRecord& r : records)
    if (r.epoch == records.front().epoch) first_epoch.push_back(&r);
  const GradRecord& a = *first_epoch.front();
  const GradRecord& z = *first_epoch.back();
  for (const GradRecord* r : first_epoch)
    RN_CHECK(r->layers.size() == a.layers.size())
        << "summary: the record of step " << r->step << " has " << r->layers.size() << " tensors, the one of step "
        << a.step << " has " << a.layers.size() << " (two runs' summaries in one file?)";
  std::string s = fmt::format("first epoch ({}): {}, {} .. {}; loss scale {:g} .. {:g}\n", a.epoch,
                              counted(static_cast<int64_t>(first_epoch.size()), "monitored step"), a.step, z.step,
                              a.loss_scale, z.loss_scale);
  const TensorStats ta = a.total(), tz = z.total();
  s += fmt::format("all gradients: norm {:.4e} -> {:.4e}; zero {:.3f}% -> {:.3f}%; inf {} NaN {} at step {}\n",
                   ta.norm(), tz.norm(), 100 * ta.fraction(ta.zeros), 100 * tz.fraction(tz.zeros), tz.infs, tz.nans,
                   z.step);
  s += fmt::format("histogram of |gradient| at step {} (decades; zeros, inf, NaN apart):\n", z.step);
  for (int b = 0; b < TensorStats::kBins; ++b) {
    if (tz.hist[b] == 0) continue;
    const std::string range = b == 0                        ? "(0, 1e-10)"
                              : b + 1 == TensorStats::kBins ? "[1e4, inf)"
                                                            : fmt::format("[1e{}, 1e{})", b - 11, b - 10);
    s += fmt::format("  {:<14} {:>6.2f}%\n", range, 100 * tz.fraction(tz.hist[b]));
  }
  s += fmt::format("\n{:<36} {:>10} {:>11} {:>11} {:>11} {:>12} {:>7} {:>7}\n", "tensor", "numel", "|g| first",
                   "|g| last", "|w| last", "upd/w mean", "zero %", "inf/NaN");
  for (size_t i = a.layers.size(); i-- > 0;) {  // forward order: stem first
    // The mean over the steps with a ratio: none where the weights were 0 before each step.
    double upd = 0;
    int64_t steps = 0;
    for (const GradRecord* r : first_epoch)
      if (std::isfinite(r->layers[i].update_ratio)) {
        upd += r->layers[i].update_ratio;
        ++steps;
      }
    const LayerGradStats& la = a.layers[i];
    const LayerGradStats& lz = z.layers[i];
    s += fmt::format("{:<36} {:>10} {:>11.4e} {:>11.4e} {:>11.4e} {:>12} {:>7.2f} {:>7}\n", la.name, la.grad.numel,
                     la.grad.norm(), lz.grad.norm(), lz.weight_norm,
                     steps > 0 ? fmt::format("{:.3e}", upd / static_cast<double>(steps)) : std::string("n/a"),
                     100 * lz.grad.fraction(lz.grad.zeros), lz.grad.infs + lz.grad.nans);
  }
  return s;
}

}  // namespace rn

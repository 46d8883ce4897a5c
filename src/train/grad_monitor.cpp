#include "train/grad_monitor.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/json_util.h"
#include "train/metrics.h"

namespace rn {

TensorStats GradRecord::total() const {
  TensorStats t;
  for (const LayerGradStats& l : layers) t.add(l.grad);
  return t;
}

double GradRecord::total_weight_norm() const {
  double s = 0;
  for (const LayerGradStats& l : layers) s += l.weight_norm * l.weight_norm;
  return std::sqrt(s);
}

double GradRecord::max_update_ratio() const {
  double m = 0;
  for (const LayerGradStats& l : layers)
    if (std::isfinite(l.update_ratio)) m = std::max(m, l.update_ratio);
  return m;
}

nlohmann::json GradRecord::to_json() const {
  nlohmann::json layers_json = nlohmann::json::array();
  for (const LayerGradStats& l : layers) {
    const TensorStats& g = l.grad;
    layers_json.push_back({{"name", l.name},
                           {"numel", g.numel},
                           {"grad_norm", g.norm()},
                           {"grad_max_abs", g.max_abs},
                           {"weight_norm", l.weight_norm},
                           {"update_ratio", l.update_ratio},
                           {"zeros", g.zeros},
                           {"infs", g.infs},
                           {"nans", g.nans},
                           {"hist", g.hist}});
  }
  return {{"epoch", epoch}, {"step", step}, {"loss_scale", loss_scale}, {"applied", applied}, {"layers", layers_json}};
}

// A record written by to_json() (one line of grad_summary.jsonl). Counts, the epoch and the
// step are integers in [0, kJsonMaxCount] (json_util.h: no double converted, nothing that
// overflows when summed); norms and ratios are numbers, or null where to_json() wrote a
// non-finite value (a diverged run), read back as NaN. Throws rn::Error saying which field.
GradRecord GradRecord::from_json(const nlohmann::json& j) {
  auto field = [](const nlohmann::json& o, const char* key) -> const nlohmann::json& {
    RN_CHECK(o.is_object() && o.contains(key)) << "no '" << key << "' in " << json_excerpt(o, 60);
    return o.at(key);
  };
  auto count = [](const nlohmann::json& v, const char* key) {
    const std::optional<int64_t> i = json_integer(v, 0, kJsonMaxCount);
    RN_CHECK(i.has_value()) << "'" << key << "' is " << json_excerpt(v, 40) << ", expected an integer in [0, "
                            << kJsonMaxCount << "]";
    return *i;
  };
  auto real = [](const nlohmann::json& v, const char* key) {
    RN_CHECK(v.is_number() || v.is_null()) << "'" << key << "' is " << json_excerpt(v, 40) << ", expected a number";
    return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
  };
  GradRecord r;
  r.epoch = count(field(j, "epoch"), "epoch");
  r.step = count(field(j, "step"), "step");
  r.loss_scale = real(field(j, "loss_scale"), "loss_scale");
  const nlohmann::json& applied = field(j, "applied");
  RN_CHECK(applied.is_boolean()) << "'applied' is " << json_excerpt(applied, 40) << ", expected true or false";
  r.applied = applied.get<bool>();
  const nlohmann::json& layers = field(j, "layers");
  RN_CHECK(layers.is_array()) << "'layers' is " << json_excerpt(layers, 40) << ", expected a list";
  for (const nlohmann::json& l : layers) {
    LayerGradStats s;
    const nlohmann::json& name = field(l, "name");
    RN_CHECK(name.is_string()) << "'name' is " << json_excerpt(name, 40) << ", expected a string";
    s.name = name.get<std::string>();
    s.grad.numel = count(field(l, "numel"), "numel");
    const double norm = real(field(l, "grad_norm"), "grad_norm");
    s.grad.sum_sq = norm * norm;
    s.grad.max_abs = real(field(l, "grad_max_abs"), "grad_max_abs");
    s.grad.zeros = count(field(l, "zeros"), "zeros");
    s.grad.infs = count(field(l, "infs"), "infs");
    s.grad.nans = count(field(l, "nans"), "nans");
    const nlohmann::json& hist = field(l, "hist");
    RN_CHECK(hist.is_array() && hist.size() == s.grad.hist.size())
        << "'hist' is " << json_excerpt(hist, 40) << ", expected " << s.grad.hist.size() << " integers";
    for (size_t b = 0; b < s.grad.hist.size(); ++b) s.grad.hist[b] = count(hist[b], "hist");
    s.weight_norm = real(field(l, "weight_norm"), "weight_norm");
    s.update_ratio = real(field(l, "update_ratio"), "update_ratio");
    r.layers.push_back(std::move(s));
  }
  return r;
}

GradRecord collect_grad_stats(const Model& model, const float* before, double loss_scale) {
  GradRecord r;
  r.loss_scale = loss_scale;
  const float* w = model.param_data();
  const float* g = model.grad_data();
  for (const ParamView& v : model.params().params) {
    LayerGradStats s;
    s.name = v.name;
    s.grad = tensor_stats(g + v.offset, v.numel, 1.0 / loss_scale);
    if (before) {
      const DistanceNorm d = distance_norm(before + v.offset, w + v.offset, v.numel);
      s.weight_norm = d.norm_a;
      // Weights that were 0 (BN biases at the start) and moved have no finite ratio: infinity
      // (null in grad_summary.jsonl, "n/a" in tables), not a 0 that reads as "not updated".
      s.update_ratio = d.norm_a > 0     ? d.distance / d.norm_a
                       : d.distance > 0 ? std::numeric_limits<double>::infinity()
                                        : 0;
    } else {
      s.weight_norm = tensor_stats(w + v.offset, v.numel).norm();
    }
    r.layers.push_back(std::move(s));
  }
  return r;
}

GradMonitor::GradMonitor(const Model& model, int64_t interval, std::string path)
    : model_(model), interval_(interval), path_(std::move(path)) {
  RN_CHECK(interval_ >= 0) << "gradient monitor: interval must be >= 0, got " << interval_;
  // A resumed run appends: a line torn by the interruption would be a damaged record in the
  // middle of the file, which `resnet summary` refuses.
  if (!path_.empty()) cut_torn_last_line(path_);
}

void GradMonitor::before_step(int64_t step) {
  have_before_ = due(step);
  if (!have_before_) return;
  const int64_t n = model_.params().total;
  before_.assign(model_.param_data(), model_.param_data() + n);
}

std::optional<GradRecord> GradMonitor::after_step(int64_t epoch, int64_t step, double loss_scale, bool applied) {
  if (!due(step) || !have_before_) return std::nullopt;
  have_before_ = false;
  GradRecord r = collect_grad_stats(model_, before_.data(), loss_scale);
  r.epoch = epoch;
  r.step = step;
  r.applied = applied;
  if (!path_.empty()) {
    std::ofstream f(path_, std::ios::app);
    f << r.to_json().dump() << "\n";
    f.flush();
    RN_CHECK(f.good()) << "gradient monitor: cannot write " << path_ << ": " << std::strerror(errno);
  }
  return r;
}

std::vector<GradRecord> read_grad_summary(const std::string& path) {
  std::ifstream f(path);
  RN_CHECK(f.is_open()) << "cannot open gradient summary '" << path << "'";
  std::vector<GradRecord> out;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    if (line.empty()) continue;
    try {
      out.push_back(GradRecord::from_json(nlohmann::json::parse(line)));
    } catch (const std::exception& e) {  // nlohmann's parse errors and from_json's rn::Error
      // A torn last line from a killed run; a file whose only line is not a record is no summary.
      if (f.peek() == EOF && !out.empty()) break;
      RN_FAIL() << path << ":" << no << ": not a gradient summary record (" << e.what() << ")";
    }
  }
  // Files written before 2026-12-03 counted epochs from 0 (now from 1, as every record): a
  // record of epoch 0 marks one, whose epochs are moved to the current convention.
  if (std::any_of(out.begin(), out.end(), [](const GradRecord& r) { return r.epoch == 0; }))
    for (GradRecord& r : out) ++r.epoch;
  return out;
}

nlohmann::json grad_metrics_fields(const GradRecord& r) {
  const TensorStats t = r.total();
  return {{"grad_norm", t.norm()},
          {"weight_norm", r.total_weight_norm()},
          {"max_update_ratio", r.max_update_ratio()},
          {"zero_fraction", t.fraction(t.zeros)},
          {"inf_fraction", t.fraction(t.infs)},
          {"nan_fraction", t.fraction(t.nans)},
          {"applied", r.applied}};
}

}  // namespace rn

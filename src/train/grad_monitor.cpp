#include "train/grad_monitor.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/json_util.h"

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
  for (const LayerGradStats& l : layers) m = std::max(m, l.update_ratio);
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

// Counts are read as integers in range (json_util.h): get<int64_t>() of a double out of
// range is undefined behaviour. A bad field throws nlohmann's type_error, which
// read_grad_summary() turns into an error naming the file and line.
GradRecord GradRecord::from_json(const nlohmann::json& j) {
  auto integer = [](const nlohmann::json& v, const char* key) {
    const std::optional<int64_t> i = json_integer(v, INT64_MIN, INT64_MAX);
    if (!i) throw nlohmann::json::type_error::create(302, std::string("'") + key + "' is " + json_excerpt(v, 40) +
                                                              ", expected an integer", &v);
    return *i;
  };
  auto count = [&](const nlohmann::json& o, const char* key) { return integer(o.at(key), key); };
  GradRecord r;
  r.epoch = count(j, "epoch");
  r.step = count(j, "step");
  r.loss_scale = j.at("loss_scale").get<double>();
  r.applied = j.at("applied").get<bool>();
  for (const auto& l : j.at("layers")) {
    LayerGradStats s;
    s.name = l.at("name").get<std::string>();
    s.grad.numel = count(l, "numel");
    const double norm = l.at("grad_norm").get<double>();
    s.grad.sum_sq = norm * norm;
    s.grad.max_abs = l.at("grad_max_abs").get<double>();
    s.grad.zeros = count(l, "zeros");
    s.grad.infs = count(l, "infs");
    s.grad.nans = count(l, "nans");
    const nlohmann::json& hist = l.at("hist");
    if (!hist.is_array() || hist.size() != s.grad.hist.size())
      throw nlohmann::json::type_error::create(302, "'hist' is " + json_excerpt(hist, 40) + ", expected " +
                                                        std::to_string(s.grad.hist.size()) + " integers", &hist);
    for (size_t b = 0; b < s.grad.hist.size(); ++b) s.grad.hist[b] = integer(hist[b], "hist");
    s.weight_norm = l.at("weight_norm").get<double>();
    s.update_ratio = l.at("update_ratio").get<double>();
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
      s.update_ratio = d.norm_a > 0 ? d.distance / d.norm_a : 0;
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
    RN_CHECK(f.good()) << "gradient monitor: cannot write " << path_;
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
    } catch (const nlohmann::json::exception& e) {
      if (f.peek() == EOF) break;  // a torn last line from a killed run
      RN_FAIL() << path << ":" << no << ": not a gradient summary record (" << e.what() << ")";
    }
  }
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

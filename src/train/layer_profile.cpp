#include "train/layer_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/zoo.h"
#include "prof/run_delay.h"
#include "prof/trace.h"
#include "train/device.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/train_step.h"

namespace rn {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Staged on the host and copied, so that it works wherever the plan keeps its tensors.
void fill_input(Plan& plan, int64_t classes, uint64_t seed) {
  Rng rng(seed);
  const Tensor in = plan.input();
  std::vector<float> px(static_cast<size_t>(in.numel()));
  for (float& v : px) v = rng.normal();
  std::vector<uint8_t> staged(in.bytes());
  convert(staged.data(), in.dtype, px.data(), DType::f32, px.size());
  plan.copy_from_host(in, staged.data());
  std::vector<int32_t> labels(static_cast<size_t>(plan.options().batch));
  for (int32_t& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  plan.copy_from_host(plan.labels(), labels.data());
}

// Mean seconds of plan step `name` over `reps` forward passes (after one warm-up).
double time_forward_step(Plan& plan, const std::string& name, int reps) {
  plan.forward();
  plan.set_profiling(true);
  for (int i = 0; i < reps; ++i) plan.forward();
  const auto names = plan.step_names();
  const auto it = std::find(names.begin(), names.end(), name);
  RN_CHECK(it != names.end()) << "peak benchmark: no plan step '" << name << "'";
  const double s = plan.step_seconds()[static_cast<size_t>(it - names.begin())] / reps;
  plan.set_profiling(false);
  return s;
}

const char* node_kind(const Node& n) {
  if (attrs_if<ConvAttrs>(n)) return "conv";
  if (attrs_if<BatchNormAttrs>(n)) return "bn";
  if (attrs_if<ReluAttrs>(n)) return "relu";
  if (attrs_if<MaxPoolAttrs>(n)) return "maxpool";
  if (attrs_if<GlobalAvgPoolAttrs>(n)) return "avgpool";
  if (attrs_if<LinearAttrs>(n)) return "linear";
  return "input";
}

// Forward multiply-accumulates per sample of a conv or linear node; 0 otherwise.
double node_macs(const Graph& g, const Node& n) {
  if (const auto* c = attrs_if<ConvAttrs>(n)) {
    const Conv2dParams& p = c->p;
    return static_cast<double>(n.shape.numel()) * static_cast<double>(p.in_channels / p.groups) *
           static_cast<double>(p.kernel_h * p.kernel_w);
  }
  if (const auto* l = attrs_if<LinearAttrs>(n)) return static_cast<double>(l->in_features * l->out_features);
  (void)g;
  return 0;
}

// Approximate elementwise flops per output element of the other layers (forward, backward).
std::pair<double, double> elementwise_flops(const Node& n) {
  if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
    const double fuse = b->fuse == BnFuse::none ? 0 : b->fuse == BnFuse::relu ? 1 : 2;
    return {5 + fuse, 9 + fuse};  // statistics + normalise (+ add / relu); their gradients
  }
  if (attrs_if<ReluAttrs>(n)) return {1, 1};
  if (const auto* m = attrs_if<MaxPoolAttrs>(n)) return {static_cast<double>(m->kernel * m->kernel), 1};
  return {0, 0};
}

struct Accum {
  LayerProfile p;
  int order = 0;
};

// What the profile needs to attribute a plan step to a layer.
struct StepContext {
  const Graph& graph;
  const std::map<std::string, int>& node_of;  // node name -> id
  double batch;
  size_t weight_bytes, activation_bytes;  // per element
};

// One plan step's layer and work: "fwd NODE", "bwd NODE", "bwd_data NODE", "bwd_weights NODE"
// belong to that node; "fwd loss" / "bwd loss" to the loss; casts, gradient sums and O2
// recomputation are grouped by what they are.
struct StepWork {
  std::string layer, kind;
  int node = -1;  // the graph node, for a node's own steps
  bool backward = false;
  double macs = 0, flops = 0, bytes = 0;
};

StepWork step_work(const StepContext& c, const std::string& name, const Plan::StepBytes& sb) {
  const size_t sp = name.find(' ');
  const std::string verb = name.substr(0, sp);
  const std::string rest = sp == std::string::npos ? "" : name.substr(sp + 1);
  StepWork w;
  w.layer = rest;
  w.bytes = static_cast<double>(sb.read + sb.written);
  w.backward = verb.rfind("bwd", 0) == 0 || verb == "recompute";
  const auto it = c.node_of.find(rest);
  const bool node_step = verb == "fwd" || verb == "bwd" || verb == "bwd_data" || verb == "bwd_weights";
  if (it != c.node_of.end() && node_step) {
    const Node& n = c.graph.node(it->second);
    w.kind = node_kind(n);
    w.node = it->second;
    const double m = node_macs(c.graph, n) * c.batch;
    const auto [ef, eb] = elementwise_flops(n);
    const double out_elems = static_cast<double>(n.shape.numel()) * c.batch;
    double weight_elems = 0;
    if (const auto* cv = attrs_if<ConvAttrs>(n))
      weight_elems = static_cast<double>(cv->p.out_channels * (cv->p.in_channels / cv->p.groups) * cv->p.kernel_h *
                                         cv->p.kernel_w);
    if (const auto* l = attrs_if<LinearAttrs>(n)) weight_elems = static_cast<double>(l->in_features * l->out_features);
    if (verb == "fwd") {
      w.macs = m;
      w.flops = 2 * m + ef * out_elems;
      w.bytes += weight_elems * static_cast<double>(c.weight_bytes);
    } else if (verb == "bwd_data") {
      w.macs = m;
      w.flops = 2 * m;
      w.bytes += weight_elems * static_cast<double>(c.weight_bytes);
    } else if (verb == "bwd_weights") {
      w.macs = m;
      w.flops = 2 * m;
      w.bytes += weight_elems * 8.0;  // the fp32 parameter gradient, read and written (it accumulates)
    } else {
      w.flops = eb * out_elems;
    }
  } else if (rest == "loss") {
    w.layer = w.kind = "loss";
  } else if (verb == "recompute") {
    w.layer = "(O2 recomputation)";
    w.kind = "recompute";
  } else if (verb == "cast" || rest.rfind("cast", 0) == 0) {
    w.layer = "(casts)";
    w.kind = "cast";
  } else {
    w.layer = verb == "bwd" ? "(gradient sums)" : "(" + verb + ")";
    w.kind = "add";
    w.flops = static_cast<double>(sb.written) / static_cast<double>(c.activation_bytes);
  }
  return w;
}

}  // namespace

DevicePeaks measure_peaks(DeviceChoice device, DType dtype, const BackendOptions& options) {
  auto backend = make_backend_for(device, options);
  const bool gpu = backend->device() == Device::cuda;
  DevicePeaks peaks;
  PlanOptions po;
  po.mode = PlanMode::eval;
  po.dtype = dtype;
  po.activation_dtype = dtype;
  po.layout = backend->preferred_layout();
  {  // GEMM: [M, K] x [K, N] through a linear layer.
    const int64_t n = gpu ? 8192 : 1024;
    Graph g;
    g.name = "peak_gemm";
    int x = g.input(n, 1, 1);
    x = g.global_avg_pool(x, "gap");
    g.linear(x, "gemm", n, false);
    Model m(std::move(g));
    m.init(1);
    po.batch = n;
    Plan plan(m, backend.get(), po);
    fill_input(plan, n, 1);
    const double s = time_forward_step(plan, "fwd gemm", gpu ? 20 : 3);
    peaks.flops_per_s = 2.0 * static_cast<double>(n) * n * n / s;
  }
  {  // Streaming: ReLU over a tensor much larger than the caches (read + write).
    const int64_t c = 64, hw = gpu ? 1024 : 512, batch = gpu ? 8 : 2;
    Graph g;
    g.name = "peak_stream";
    int x = g.input(c, hw, hw);
    x = g.relu(x, "stream");
    x = g.global_avg_pool(x, "gap");
    g.linear(x, "fc", 2, false);
    Model m(std::move(g));
    m.init(1);
    po.batch = batch;
    Plan plan(m, backend.get(), po);
    fill_input(plan, 2, 2);
    const double s = time_forward_step(plan, "fwd stream", gpu ? 20 : 3);
    peaks.bytes_per_s = 2.0 * static_cast<double>(batch * c * hw * hw) * static_cast<double>(dtype_size(dtype)) / s;
  }
  return peaks;
}

ProfileReport run_profile(const ProfileOptions& o) {
  RN_CHECK(o.steps >= 1 && o.warmup >= 0) << "profile: --steps must be at least 1";
  set_host_threads(o.threads);
  ModelOptions mo;
  mo.in_channels = o.channels;
  mo.height = o.height;
  mo.width = o.width;
  mo.num_classes = o.classes;
  Model model(build_model(o.model, mo));
  model.init(1);
  BackendOptions bo;
  bo.high_precision = o.high_precision;
  bo.cpu_bf16_conv_arithmetic = o.bf16_conv_arithmetic;
  auto backend = make_backend_for(o.device, bo);
  PrecisionConfig pc;
  pc.level = o.precision.value_or(o.dtype == DType::f32 ? PrecisionLevel::O0 : PrecisionLevel::O2);
  RN_CHECK((pc.level == PrecisionLevel::O0) == (o.dtype == DType::f32))
      << "profile: precision " << enum_name(pc.level) << " with dtype " << dtype_name(o.dtype)
      << ": O0 is fp32, O1-O3 need a half dtype";
  if (o.dtype != DType::f32) pc.half_dtype = o.dtype;
  const PrecisionPolicy policy = make_precision_policy(pc, *backend);

  ProfileReport r;
  r.model = o.model;
  r.device = backend->name();
  r.backend = backend->describe();
  r.dtype = std::string(dtype_name(o.dtype));
  r.precision = std::string(enum_name(pc.level));
  r.batch = o.batch;
  r.steps = o.steps;
  r.peaks = measure_peaks(o.device, o.dtype, bo);  // the same implementation mode as the layers

  PlanOptions po;
  po.batch = o.batch;
  po.dtype = policy.conv_dtype;
  po.activation_dtype = policy.activation_dtype;
  po.layout = backend->preferred_layout();
  po.memory = o.memory;
  Plan plan(model, backend.get(), po);
  OptimizerConfig oc;
  ParamTable table = model.params();
  apply_optimizer_param_policy(table, oc);
  Optimizer opt(oc, table);
  LossScaler scaler(policy.loss_scale);
  TrainStep step(plan, opt, scaler, policy);
  fill_input(plan, o.classes, 7);
  for (int i = 0; i < o.warmup; ++i) step.run(0.01);

  // What timing one plan step costs beyond the step itself: a device synchronisation and
  // two clock reads. Measured here and taken off every profiled plan step.
  {
    constexpr int kReps = 2000;
    const auto t0 = std::chrono::steady_clock::now();
    double sink = 0;
    for (int i = 0; i < kReps; ++i) {
      const auto a = std::chrono::steady_clock::now();
      backend->synchronize();
      sink += seconds_since(a);
    }
    r.timing_overhead_s = seconds_since(t0) / kReps;
    (void)sink;
  }
  // Alternate plain and profiled steps, so that both see the same machine.
  // per_step[k][i]: plan step k in profiled iteration i.
  std::vector<std::vector<double>> per_step(static_cast<size_t>(plan.num_steps()));
  std::vector<double> plain, profiled, outside;
  const double wait0 = cpu_wait_seconds();
  const auto measure_t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step.run(0.01);
    backend->synchronize();
    plain.push_back(seconds_since(t0));
    plan.set_profiling(true);
    t0 = std::chrono::steady_clock::now();
    step.run(0.01);
    backend->synchronize();
    const double wall = seconds_since(t0);
    double in_plan = 0;
    for (size_t k = 0; k < per_step.size(); ++k) {
      per_step[k].push_back(plan.step_seconds()[k]);
      in_plan += plan.step_seconds()[k];
    }
    plan.set_profiling(false);
    profiled.push_back(wall);
    outside.push_back(wall - in_plan);
  }
  r.cpu_wait_share = (cpu_wait_seconds() - wait0) / (seconds_since(measure_t0) * std::max(1, host_threads()));
  // Means, not medians: under interference a sum of per-step medians drops the preemptions
  // that a whole step's time keeps, and the two would not add up.
  std::vector<double> acc;
  for (const auto& v : per_step) {
    double sum = 0;
    for (double x : v) sum += x;
    acc.push_back(std::max(0.0, sum / static_cast<double>(v.size()) - r.timing_overhead_s));
  }

  // Group plan steps into layers.
  const Graph& g = model.graph();
  std::map<std::string, int> node_of;
  for (size_t i = 0; i < g.nodes().size(); ++i) node_of[g.nodes()[i].name] = static_cast<int>(i);
  std::map<std::string, Accum> rows;
  const auto names = plan.step_names();
  const StepContext ctx{g, node_of, static_cast<double>(o.batch), dtype_size(policy.conv_dtype),
                        dtype_size(policy.activation_dtype)};
  for (size_t k = 0; k < names.size(); ++k) {
    r.step_spans.emplace_back(names[k], acc[k]);
    const StepWork w = step_work(ctx, names[k], plan.step_bytes(static_cast<int>(k)));
    Accum& a = rows[w.layer];
    if (a.p.name.empty()) {
      a.p.name = w.layer;
      a.p.kind = w.kind;
      a.order = static_cast<int>(k);
    }
    if (w.node >= 0) {
      a.p.arithmetic = plan.arithmetic(w.node);
      a.p.implementation = plan.implementation(w.node);
    }
    (w.backward ? a.p.bwd_s : a.p.fwd_s) += acc[k];
    a.p.macs += w.macs;
    a.p.flops += w.flops;
    a.p.bytes += w.bytes;
  }
  // Layers computing in fp32 arithmetic within a half-precision profile: the fp32 GEMM is
  // their compute roof, not the half one.
  for (const auto& [key, a] : rows)
    if (o.dtype != DType::f32 && a.p.arithmetic == DType::f32) ++r.fp32_arithmetic_layers;
  if (r.fp32_arithmetic_layers > 0) r.fp32_peaks = measure_peaks(o.device, DType::f32, bo);
  for (auto& [key, a] : rows) {
    const bool fp32 = r.fp32_arithmetic_layers > 0 && a.p.arithmetic == DType::f32;
    a.p.roof = roofline(a.p.flops, a.p.bytes, a.p.seconds(), fp32 ? r.fp32_peaks : r.peaks);
    r.layers.push_back(a.p);
    r.layers_s += a.p.seconds();
  }
  std::sort(r.layers.begin(), r.layers.end(),
            [](const LayerProfile& x, const LayerProfile& y) { return x.seconds() > y.seconds(); });
  // The optimizer, overflow check and zeroing: what the step does outside the plan.
  r.optimizer_s = mean(outside);
  r.profiled_step_s = r.layers_s + r.optimizer_s;
  r.measured_step_s = mean(plain);
  r.discrepancy = (r.profiled_step_s - r.measured_step_s) / r.measured_step_s;
  r.consistent = std::abs(r.discrepancy) <= kProfileMargin;
  return r;
}

std::string ProfileReport::table(int top) const {
  std::string s = fmt::format(
      "per-layer profile: {}, batch {}, {} (precision {}), {} ({} profiled steps, each plan step followed by a device "
      "sync)\n",
      model, batch, dtype, precision, backend, steps);
  s += fmt::format(
      "peaks measured at start: {:.1f} GFLOP/s ({} GEMM), {:.1f} GB/s (streaming ReLU, read + write); "
      "ridge {:.1f} flop/byte\n",
      peaks.flops_per_s / 1e9, dtype, peaks.bytes_per_s / 1e9, peaks.ridge());
  if (fp32_arithmetic_layers > 0)
    s += fmt::format(
        "  and for the {} {} layers that compute in fp32 arithmetic (arith fp32): {:.1f} GFLOP/s (fp32 GEMM), "
        "{:.1f} GB/s; ridge {:.1f} flop/byte\n",
        fp32_arithmetic_layers, dtype, fp32_peaks.flops_per_s / 1e9, fp32_peaks.bytes_per_s / 1e9, fp32_peaks.ridge());
  s += "\n";
  s += fmt::format("{:<28} {:<8} {:<5} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>6}\n", "layer", "kind",
                   "arith", "fwd ms", "bwd ms", "share", "GMAC", "MB", "GFLOP/s", "GB/s", "flop/B", "bound", "roof");
  const double step = profiled_step_s > 0 ? profiled_step_s : 1;
  int shown = 0;
  double rest_s = 0;
  for (const LayerProfile& l : layers) {
    if (top > 0 && shown >= top) {
      rest_s += l.seconds();
      continue;
    }
    ++shown;
    s += fmt::format(
        "{:<28} {:<8} {:<5} {:>9.3f} {:>9.3f} {:>5.1f}% {:>9.3f} {:>9.2f} {:>9.1f} {:>8.1f} {:>7.1f} {:>8} {:>5.0f}%\n",
        l.name.size() > 28 ? l.name.substr(0, 27) + "~" : l.name, l.kind,
        l.arithmetic ? dtype_name(*l.arithmetic) : std::string_view(), 1e3 * l.fwd_s, 1e3 * l.bwd_s,
        100 * l.seconds() / step, l.macs / 1e9, l.bytes / 1e6, l.roof.achieved_flops / 1e9, l.roof.achieved_bytes / 1e9,
        l.roof.intensity, l.roof.bound, 100 * l.roof.roof_fraction);
  }
  if (rest_s > 0)
    s += fmt::format("{:<28} {:<14} {:>19.3f} {:>5.1f}%\n", fmt::format("({} more layers)", layers.size() - shown), "",
                     1e3 * rest_s, 100 * rest_s / step);
  s += fmt::format("{:<28} {:<14} {:>19.3f} {:>5.1f}%\n", "(optimizer, overflow check, zeroing)", "", 1e3 * optimizer_s,
                   100 * optimizer_s / step);
  s +=
      fmt::format("\ntiming one plan step costs {:.2f} us (device sync and clock reads), measured and taken off each\n",
                  1e6 * timing_overhead_s);
  s += fmt::format(
      "sum: layers {:.3f} ms + outside the plan {:.3f} ms = {:.3f} ms; measured step without profiling "
      "{:.3f} ms (mean of {}); difference {:+.1f}% ({} the stated {:.0f}% margin)\n",
      1e3 * layers_s, 1e3 * optimizer_s, 1e3 * profiled_step_s, 1e3 * measured_step_s, steps, 100 * discrepancy,
      consistent ? "within" : "OUTSIDE", 100 * kProfileMargin);
  // Under contention the sums still agree (both sides slow down alike); the times do not hold.
  if (cpu_wait_share > kProfileContention)
    s += fmt::format(
        "WARNING: the profile's threads waited for a core {:.0f}% of the time (other programs, or more threads "
        "than cores): every time above is inflated; profile again on a quiet machine, or with --threads no more "
        "than the idle cores (OpenMP: OMP_WAIT_POLICY=passive stops waiting threads from spinning)\n",
        100 * cpu_wait_share);
  return s;
}

nlohmann::json ProfileReport::to_json() const {
  nlohmann::json lj = nlohmann::json::array();
  for (const LayerProfile& l : layers)
    lj.push_back({{"name", l.name},
                  {"kind", l.kind},
                  {"arithmetic", l.arithmetic ? nlohmann::json(dtype_name(*l.arithmetic)) : nlohmann::json()},
                  {"implementation", l.implementation},
                  {"fwd_s", l.fwd_s},
                  {"bwd_s", l.bwd_s},
                  {"macs", l.macs},
                  {"flops", l.flops},
                  {"bytes", l.bytes},
                  {"achieved_flops_per_s", l.roof.achieved_flops},
                  {"achieved_bytes_per_s", l.roof.achieved_bytes},
                  {"intensity", l.roof.intensity},
                  {"bound", l.roof.bound},
                  {"roof_fraction", l.roof.roof_fraction}});
  auto if_measured = [&](double v) { return fp32_arithmetic_layers > 0 ? nlohmann::json(v) : nlohmann::json(); };
  return {{"model", model},
          {"device", device},
          {"backend", backend},
          {"dtype", dtype},
          {"precision", precision},
          {"batch", batch},
          {"steps", steps},
          {"peak_flops_per_s", peaks.flops_per_s},
          {"peak_bytes_per_s", peaks.bytes_per_s},
          {"fp32_arithmetic_layers", fp32_arithmetic_layers},
          {"fp32_peak_flops_per_s", if_measured(fp32_peaks.flops_per_s)},
          {"fp32_peak_bytes_per_s", if_measured(fp32_peaks.bytes_per_s)},
          {"layers_s", layers_s},
          {"outside_plan_s", optimizer_s},
          {"profiled_step_s", profiled_step_s},
          {"measured_step_s", measured_step_s},
          {"timing_overhead_s", timing_overhead_s},
          {"discrepancy", discrepancy},
          {"margin", kProfileMargin},
          {"consistent", consistent},
          {"cpu_wait_share", std::isfinite(cpu_wait_share) ? nlohmann::json(cpu_wait_share) : nlohmann::json()},
          {"layers", lj}};
}

void ProfileReport::write_trace(const std::string& path) const {
  TraceRecorder t;
  t.name_thread("mean training step (plan steps laid end to end)");
  double at = 0;
  for (const auto& [name, s] : step_spans) {
    t.complete(name, name.rfind("fwd", 0) == 0 ? "forward" : "backward", at, 1e6 * s);
    at += 1e6 * s;
  }
  t.complete("optimizer, overflow check, zeroing", "optimizer", at, 1e6 * optimizer_s);
  t.write(path);
}

}  // namespace rn

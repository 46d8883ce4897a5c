#include "train/doctor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "core/build_info.h"
#include "core/log.h"
#include "core/plural.h"
#include "core/thread_pool.h"
#include "data/loader.h"
#include "model/model.h"
#include "model/plan.h"
#include "train/data_setup.h"
#include "train/device.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace rn {

namespace {

struct HostBatch {
  std::vector<float> images;  // f32, in the plan's layout
  std::vector<int32_t> labels;
};

std::vector<HostBatch> take_batches(const Config& cfg, Layout layout, int steps) {
  Loaders loaders = make_loaders(cfg, DType::f32, layout);
  DataLoader& loader = *loaders.train;
  loader.start_epoch(0);
  std::vector<HostBatch> out;
  for (int i = 0; i < steps; ++i) {
    const Batch* b = loader.next();
    RN_CHECK(b && b->size == cfg.data.batch_size)
        << "doctor: the training set has fewer than " << steps << " full batches of " << cfg.data.batch_size
        << " (lower --steps or data.batch_size)";
    HostBatch h;
    const float* px = b->images.ptr<const float>();
    h.images.assign(px, px + b->images.numel());
    h.labels.assign(b->label_data(), b->label_data() + b->size);
    out.push_back(std::move(h));
  }
  return out;
}

// Rounds fp32 values to `half` and back, in place.
void round_through(float* x, int64_t n, DType half) {
  std::vector<uint8_t> h(static_cast<size_t>(n) * dtype_size(half));
  convert(h.data(), half, x, DType::f32, static_cast<size_t>(n));
  convert(x, DType::f32, h.data(), half, static_cast<size_t>(n));
}

// Staged on the host and copied, so that it works wherever the plan keeps its tensors.
void fill(Plan& plan, const HostBatch& b) {
  const Tensor in = plan.input();
  RN_CHECK(static_cast<size_t>(in.numel()) == b.images.size()) << "doctor: batch does not fit the plan's input";
  std::vector<uint8_t> staged(in.bytes());
  convert(staged.data(), in.dtype, b.images.data(), DType::f32, b.images.size());
  plan.copy_from_host(in, staged.data());
  plan.copy_from_host(plan.labels(), b.labels.data());
}

// One training trajectory: its own model (same seed), plan, optimizer and scaler.
struct Run {
  Model model;
  ParamTable table;
  Optimizer optimizer;
  LossScaler scaler;
  std::unique_ptr<Plan> plan;
  std::unique_ptr<TrainStep> step;
  PrecisionPolicy policy;

  // With `round_to`, the weights start rounded to that dtype (the rounding baseline).
  Run(const Config& cfg, const PrecisionPolicy& p, Backend& backend, std::optional<DType> round_to = std::nullopt)
      : model(build_model(cfg.model.name, model_options(cfg.model)), cfg.optimizer.decay_bn_and_bias),
        table(params_of(model, cfg.optimizer)),
        optimizer(cfg.optimizer, table),
        scaler(p.loss_scale),
        policy(p) {
    model.init(static_cast<uint64_t>(cfg.run.seed));
    if (round_to)
      for (const ParamView& v : model.params().params) round_through(model.param_data() + v.offset, v.numel, *round_to);
    PlanOptions po;
    po.batch = cfg.data.batch_size;
    po.dtype = p.conv_dtype;
    po.activation_dtype = p.activation_dtype;
    po.layout = backend.preferred_layout();
    po.memory = cfg.memory.level;
    po.label_smoothing = static_cast<float>(cfg.loss.label_smoothing);
    plan = std::make_unique<Plan>(model, &backend, po);
    step = std::make_unique<TrainStep>(*plan, optimizer, scaler, policy);
  }
  static ParamTable params_of(Model& m, const OptimizerConfig& oc) {
    ParamTable t = m.params();
    apply_optimizer_param_policy(t, oc);
    return t;
  }
};

std::string compute_dtype(ParamKind kind, const PrecisionPolicy& p) {
  switch (kind) {
    case ParamKind::conv_weight:
    case ParamKind::conv_bias:
    case ParamKind::linear_weight:
    case ParamKind::linear_bias:
      return std::string(dtype_name(p.conv_dtype));
    case ParamKind::bn_gamma:
    case ParamKind::bn_beta:
      return fmt::format("fp32 BN, {} out", dtype_name(p.activation_dtype));
  }
  return "?";
}

// A fraction as a percentage; n/a where not measured (negative); NaN and inf said as such (a
// gradient of the mixed run that was not finite), never "nan%" or "-nan%".
std::string pct(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return "inf";
  return f < 0 ? "n/a" : fmt::format("{:.2f}%", 100 * f);
}
bool measured(double f) { return !(f < 0); }  // NaN and inf are measured: not finite

}  // namespace

std::string format_scale(double s) {
  if (!std::isfinite(s)) return s > 0 ? "inf" : "n/a";
  if (s == 0) return "0";
  const double e = std::log2(s);
  if (e == std::round(e)) return fmt::format("2^{}", static_cast<int>(e));
  return fmt::format("{:g}", s);
}

void decide_doctor_verdict(DoctorReport& r, const DiagnosticsConfig& d) {
  r.problems.clear();
  const DoctorTensor* worst_diff = nullptr;
  const DoctorTensor* worst_under = nullptr;
  const DoctorTensor* worst_over = nullptr;
  int64_t not_finite = 0;  // tensors whose mixed gradient was inf or NaN at the first step
  for (const DoctorTensor& t : r.tensors) {
    if (measured(t.rel_diff_first) && !std::isfinite(t.rel_diff_first)) ++not_finite;
    if (t.rel_diff_first >= 0 && (!worst_diff || t.rel_diff_first > worst_diff->rel_diff_first)) worst_diff = &t;
    if (!worst_under || t.underflow > worst_under->underflow) worst_under = &t;
    if (!worst_over || t.overflow > worst_over->overflow) worst_over = &t;
  }
  auto count = [&](auto pred) { return std::count_if(r.tensors.begin(), r.tensors.end(), pred); };
  // Under policy none the scale is 1 whatever `initial` says: the advice names a policy too,
  // unless the scale it recommends is 1 (bf16, as a rule), which policy none already uses.
  const std::string policy = r.loss_scale_policy == "none" && r.level != "O0" && r.recommended_scale != 1.0
                                 ? "precision.loss_scale.policy=dynamic (policy none keeps the scale at 1) and "
                                 : "";
  const std::string rec =
      std::isfinite(r.recommended_scale)
          // The value as the config takes it (a number), with its power of two.
          ? fmt::format("{}precision.loss_scale.initial={:g} ({}; safe range {} .. {})", policy, r.recommended_scale,
                        format_scale(r.recommended_scale), format_scale(r.safe.lo), format_scale(r.safe.hi))
          : std::string("no loss scale fits every tensor: use bf16 or keep the affected layers in fp32");
  // Measured, not computed: the mixed run skipped steps for inf/NaN gradients. The ranges
  // below see parameter gradients only, so this is also where an activation or the loss
  // overflowing the half dtype in the forward or backward pass shows.
  if (r.mixed_ran && r.overflow_skips > 0)
    r.problems.push_back(fmt::format(
        "overflow: {} of {} in the {} run {} skipped for inf/NaN gradients (loss scale {} -> {}){}; where the "
        "parameter gradients' ranges leave room, an activation or the loss overflows {}: normalise the input, "
        "keep that layer in fp32, or use bf16; else set {}",
        r.overflow_skips, counted(r.steps, "step"), r.level, r.overflow_skips == 1 ? "was" : "were",
        format_scale(r.loss_scale), format_scale(r.final_scale),
        r.overflow_skips >= r.steps ? ": it trained nothing" : "", r.half, rec));
  if (r.mixed_ran && measured(r.rel_diff_total) && !std::isfinite(r.rel_diff_total))
    r.problems.push_back(fmt::format("disagreement: the {} gradient is not finite (inf or NaN) in {} at the first step",
                                     r.level, counted(not_finite, "tensor")));
  if (worst_under && worst_under->underflow > d.doctor_max_underflow) {
    const auto n = count([&](const DoctorTensor& t) { return t.underflow > d.doctor_max_underflow; });
    r.problems.push_back(fmt::format(
        "underflow: {} tensors lose more than {} of their gradient values to zero in {} at loss scale {} (worst {}: "
        "{}); set {}",
        n, pct(d.doctor_max_underflow), r.half, format_scale(r.loss_scale), worst_under->name,
        pct(worst_under->underflow), rec));
  }
  if (worst_over && worst_over->overflow > d.doctor_max_overflow) {
    const auto n = count([&](const DoctorTensor& t) { return t.overflow > d.doctor_max_overflow; });
    r.problems.push_back(fmt::format(
        "overflow: {} tensors have more than {} of their gradient values overflow {} at loss scale {} (worst {}: {}); "
        "set {}",
        n, pct(d.doctor_max_overflow), r.half, format_scale(r.loss_scale), worst_over->name, pct(worst_over->overflow),
        rec));
  }
  // A difference past its threshold fails only when it is also past doctor_max_diff_ratio times
  // what rounding the weights and input alone does to the fp32 gradient (the network's own
  // sensitivity); without a baseline (none measured), the threshold alone decides.
  auto past_baseline = [&](double diff, double baseline) {
    return baseline < 0 || diff > d.doctor_max_diff_ratio * baseline;
  };
  if (r.rel_diff_total > d.doctor_max_grad_diff && past_baseline(r.rel_diff_total, r.rounding_diff_total))
    r.problems.push_back(fmt::format(
        "disagreement: the {} gradient differs from fp32 by {} over all tensors (threshold {}, "
        "diagnostics.doctor_max_grad_diff{}; largest tensor {}: {})",
        r.level, pct(r.rel_diff_total), pct(d.doctor_max_grad_diff),
        r.rounding_diff_total < 0
            ? std::string()
            : fmt::format(
                  ", and {:.2f} times the rounding baseline {} (limit {:g}x, diagnostics.doctor_max_diff_ratio)",
                  r.rel_diff_total / std::max(r.rounding_diff_total, 1e-300), pct(r.rounding_diff_total),
                  d.doctor_max_diff_ratio),
        worst_diff->name, pct(worst_diff->rel_diff_first)));
  // The tensor that fails worst: past its threshold and its own baseline, by the largest difference.
  const DoctorTensor* failing = nullptr;
  for (const DoctorTensor& t : r.tensors)
    if (t.rel_diff_first > d.doctor_max_tensor_grad_diff && past_baseline(t.rel_diff_first, t.rel_diff_rounding) &&
        (!failing || t.rel_diff_first > failing->rel_diff_first))
      failing = &t;
  if (failing)
    r.problems.push_back(
        fmt::format("disagreement: the {} gradient of {} differs from fp32 by {} (threshold {}, "
                    "diagnostics.doctor_max_tensor_grad_diff{})",
                    r.level, failing->name, pct(failing->rel_diff_first), pct(d.doctor_max_tensor_grad_diff),
                    failing->rel_diff_rounding < 0
                        ? std::string()
                        : fmt::format(", and {:.2f} times its rounding baseline {} (limit {:g}x)",
                                      failing->rel_diff_first / std::max(failing->rel_diff_rounding, 1e-300),
                                      pct(failing->rel_diff_rounding), d.doctor_max_diff_ratio)));
  r.pass = r.problems.empty();
  if (!r.pass) {
    r.verdict = "verdict: FAIL: " + r.problems.front() +
                (r.problems.size() > 1 ? fmt::format(" (+{} more, see above)", r.problems.size() - 1) : "");
    return;
  }
  std::string agree =
      r.mixed_ran && worst_diff ? fmt::format(
                                      "{} {} gradient agrees with fp32 within {} over all tensors (largest "
                                      "tensor difference {}: {}; rounding baseline {})",
                                      r.level, r.half, pct(r.rel_diff_total), worst_diff->name,
                                      pct(worst_diff->rel_diff_first), pct(r.rounding_diff_total))
      : r.level == "O0"
          ? fmt::format(
                "precision O0 is fp32 everywhere, so there is nothing to compare; the {} ranges are "
                "simulated from the fp32 gradients (set precision.level to check a mixed level)",
                r.half)
          : fmt::format("{} {} not run here ({}); ranges simulated from fp32 gradients", r.level, r.half, "see above");
  r.verdict = fmt::format("verdict: OK: {}; underflow at most {} and overflow at most {} at loss scale {}; {}", agree,
                          pct(worst_under ? worst_under->underflow : 0), pct(worst_over ? worst_over->overflow : 0),
                          format_scale(r.loss_scale), "recommended " + rec);
}

DoctorReport run_doctor(const Config& cfg, const DoctorOptions& options) {
  RN_CHECK(options.steps >= 1) << "doctor: --steps must be at least 1, got " << options.steps;
  set_host_threads(static_cast<int>(cfg.run.threads));
  auto backend = make_backend_for(cfg.run.device, backend_options_for(cfg.run));
  DoctorReport r;
  r.backend = backend->describe();
  r.model = cfg.model.name;
  r.level = std::string(enum_name(cfg.precision.level));
  r.half = std::string(dtype_name(cfg.precision.half_dtype));
  r.steps = options.steps;
  PrecisionPolicy mixed_policy = intended_precision_policy(cfg.precision);  // also where refused
  r.precision = mixed_policy.describe();
  const bool scaled =
      cfg.precision.level != PrecisionLevel::O0 && cfg.precision.loss_scale.policy != LossScalePolicy::none;
  r.loss_scale = scaled ? cfg.precision.loss_scale.initial : 1.0;
  r.loss_scale_policy = std::string(enum_name(cfg.precision.loss_scale.policy));
  if (cfg.precision.level == PrecisionLevel::O0) {
    r.not_run_why = "precision.level is O0: nothing to compare; the ranges show what " + r.half + " would need";
  } else {
    try {
      mixed_policy = make_precision_policy(cfg.precision, *backend);
      r.mixed_ran = true;
    } catch (const Error& e) {
      r.not_run_why = e.what();
    }
  }
  r.activation_dtype = std::string(dtype_name(mixed_policy.activation_dtype));
  r.bn_dtype = "fp32 (parameters, statistics, arithmetic)";
  r.loss_dtype = "fp32";
  r.master_dtype = mixed_policy.round_master_to_half ? "fp32 rounded to " + r.half + " after every update" : "fp32";

  const std::vector<HostBatch> batches = take_batches(cfg, backend->preferred_layout(), options.steps);
  PrecisionPolicy fp32_policy;  // O0, no loss scale
  fp32_policy.loss_scale.policy = LossScalePolicy::none;
  const double lr = cfg.optimizer.base_lr * 0.1;  // a small fixed step: the doctor looks at gradients
  // The rounding baseline: fp32 throughout, from weights and an input rounded to the half dtype.
  // Its first gradient is kept on the host and its model and plan freed before the two runs
  // are made, so that it adds nothing to their peak memory.
  std::vector<float> rounded_grads;
  if (r.mixed_ran) {
    Run rounded(cfg, fp32_policy, *backend, cfg.precision.half_dtype);
    HostBatch b = batches.front();
    round_through(b.images.data(), static_cast<int64_t>(b.images.size()), cfg.precision.half_dtype);
    fill(*rounded.plan, b);
    rounded.step->run(lr);
    rounded.step->sync_host_state();
    size_t n = 0;
    for (const ParamView& v : rounded.model.params().params) n = std::max(n, static_cast<size_t>(v.offset + v.numel));
    rounded_grads.assign(rounded.model.grad_data(), rounded.model.grad_data() + n);
  }
  Run ref(cfg, fp32_policy, *backend);
  std::unique_ptr<Run> mixed = r.mixed_ran ? std::make_unique<Run>(cfg, mixed_policy, *backend) : nullptr;
  const std::vector<ParamView>& views = ref.model.params().params;
  std::vector<DoctorTensor> t(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    t[i].name = views[i].name;
    t[i].kind = std::string(param_kind_name(views[i].kind));
    t[i].compute = compute_dtype(views[i].kind, mixed_policy);
    t[i].numel = views[i].numel;
    t[i].safe = {0, std::numeric_limits<double>::infinity()};
  }
  if (mixed) {  // the arithmetic made visible: convolutions a backend widens to fp32
    const Graph& g = mixed->model.graph();
    for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
      if (const BatchNormKernel* bn = mixed->plan->batch_norm(id)) {
        ++r.bns;
        r.half_copy_bns += bn->desc().mixed();
      }
      const std::optional<DType> a = attrs_if<ConvAttrs>(g.node(id)) ? mixed->plan->arithmetic(id) : std::nullopt;
      if (!a) continue;
      ++r.convs;
      // O1's fused casts: the convolution writes its output (and input gradient) in fp32.
      const DType out = mixed->plan->activation(id).dtype;
      if (*a == mixed_policy.conv_dtype && out == mixed_policy.conv_dtype) continue;
      std::string compute(dtype_name(mixed_policy.conv_dtype));
      if (*a != mixed_policy.conv_dtype) {
        ++r.fp32_arithmetic_convs;
        compute += fmt::format(", {} arith", dtype_name(*a));
      }
      if (out != mixed_policy.conv_dtype) {
        ++r.fp32_output_convs;
        compute += fmt::format(", {} out", dtype_name(out));
      }
      const Model::NodeSlots s = mixed->model.slots(id);
      for (const int p : {s.weight, s.bias})
        if (p >= 0) t[static_cast<size_t>(p)].compute = compute;
    }
  }
  const double underflow_tol = cfg.diagnostics.doctor_max_underflow;
  double total_d2 = 0, total_n2 = 0;  // the whole gradient's difference, first step
  double rounding_d2 = 0;             // the rounding baseline's
  for (int k = 0; k < options.steps; ++k) {
    fill(*ref.plan, batches[static_cast<size_t>(k)]);
    ref.step->run(lr);
    ref.step->sync_host_state();  // on a device: gradients, scale and counters back to the host
    r.loss_fp32.push_back(ref.plan->loss());
    double scale = r.loss_scale;
    if (mixed) {
      fill(*mixed->plan, batches[static_cast<size_t>(k)]);
      scale = mixed->scaler.scale();  // current: synchronised after the previous step
      mixed->step->run(lr);
      mixed->step->sync_host_state();
      r.loss_mixed.push_back(mixed->plan->loss());
    }
    const float* g = ref.model.grad_data();
    for (size_t i = 0; i < views.size(); ++i) {
      const ParamView& v = views[i];
      const float* gi = g + v.offset;
      if (k == 0) t[i].grad_norm = tensor_stats(gi, v.numel).norm();
      const HalfRangeCounts c = half_range_counts(gi, v.numel, scale, cfg.precision.half_dtype);
      t[i].underflow = std::max(t[i].underflow, c.underflow_fraction());
      t[i].overflow = std::max(t[i].overflow, c.overflow_fraction());
      t[i].safe = intersect(t[i].safe, safe_scale_range(gi, v.numel, cfg.precision.half_dtype, underflow_tol));
      if (mixed) {
        const DistanceNorm dn = distance_norm(gi, mixed->model.grad_data() + v.offset, v.numel, 1.0 / scale);
        const double d = dn.relative();
        if (k == 0) {
          t[i].rel_diff_first = d;
          total_d2 += dn.distance * dn.distance;
          total_n2 += dn.norm_a * dn.norm_a;
          const DistanceNorm rd = distance_norm(gi, rounded_grads.data() + v.offset, v.numel, 1.0);
          t[i].rel_diff_rounding = rd.relative();
          rounding_d2 += rd.distance * rd.distance;
        }
        t[i].rel_diff_max =
            std::isnan(d) || std::isnan(t[i].rel_diff_max) ? std::nan("") : std::max(t[i].rel_diff_max, d);
      }
    }
  }
  if (mixed) {
    r.rel_diff_total = DistanceNorm{std::sqrt(total_d2), std::sqrt(total_n2)}.relative();
    r.rounding_diff_total = DistanceNorm{std::sqrt(rounding_d2), std::sqrt(total_n2)}.relative();
  }
  if (mixed) {
    r.overflow_skips = mixed->scaler.skipped_steps();
    r.final_scale = mixed->scaler.scale();
  } else {
    r.final_scale = r.loss_scale;
  }
  r.safe = {0, std::numeric_limits<double>::infinity()};
  for (const DoctorTensor& x : t) r.safe = intersect(r.safe, x.safe);
  r.recommended_scale = recommended_scale(r.safe);
  r.tensors.assign(t.rbegin(), t.rend());  // forward order
  decide_doctor_verdict(r, cfg.diagnostics);
  return r;
}

std::string DoctorReport::table() const {
  std::string s;
  s += fmt::format("precision doctor: {}, {}, same initial weights and batches in fp32 (O0) and {}\n", model,
                   counted(steps, "step"), level);
  s += fmt::format("  {}\n", precision);
  s += fmt::format("  backend: {}\n", backend);
  s += fmt::format("  activations {}; BN {}; loss {}; master weights {}; parameter gradients fp32\n", activation_dtype,
                   bn_dtype, loss_dtype, master_dtype);
  if (fp32_arithmetic_convs > 0)
    s += fmt::format(
        "  {} of {} convolutions compute in fp32 arithmetic on {} tensors (\"{}, fp32 arith\": "
        "run.cpu_bf16_conv_arithmetic; the products are exact either way, only the summation order differs)\n",
        fp32_arithmetic_convs, convs, half, half);
  if (fp32_output_convs > 0)
    s += fmt::format(
        "  {} of {} convolutions write their outputs (and, where their input is fp32, its gradient) in fp32 (\"fp32 "
        "out\": the casts to the fp32 activations fused in, so those values are not rounded to {})\n",
        fp32_output_convs, convs, half);
  if (half_copy_bns > 0)
    s += fmt::format(
        "  {} of {} batch norms write the {} values the convolutions around them read (their outputs where only "
        "convolutions read them, the gradients of the convolutions before them): those casts fused in too\n",
        half_copy_bns, bns, half);
  if (!mixed_ran) s += fmt::format("  {} run: not made: {}\n", level, not_run_why);
  s += fmt::format(
      "  underflow/overflow: fp32 gradients x loss scale {} checked against the {} range (computed, not "
      "measured in {} arithmetic)\n",
      format_scale(loss_scale), half, half);
  std::string losses;
  for (size_t i = 0; i < loss_fp32.size(); ++i)
    losses += fmt::format("{}{:.4f}{}", i ? ", " : "", loss_fp32[i],
                          i < loss_mixed.size() ? fmt::format(" / {:.4f}", loss_mixed[i]) : "");
  s += fmt::format("  loss per step (fp32{}): {}\n", mixed_ran ? " / " + level : "", losses);
  if (mixed_ran)
    s += fmt::format("  overflow-skipped steps in the {} run: {} of {} (loss scale {} -> {})\n", level, overflow_skips,
                     steps, format_scale(loss_scale), format_scale(final_scale));
  if (rounding_diff_total >= 0)
    s += fmt::format(
        "  rounding baseline (\"rounding\"): fp32 from weights and input rounded to {}, against fp32: what the "
        "network itself does with the smallest {} perturbation\n",
        half, half);
  s += fmt::format("\n{:<34} {:>9} {:<16} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}  {}\n", "tensor", "numel",
                   "computes in", "grad norm", "diff 1st", "rounding", "diff max", "underflow", "overflow",
                   "safe loss scales");
  for (const DoctorTensor& x : tensors)
    s += fmt::format("{:<34} {:>9} {:<16} {:>10.3e} {:>10} {:>10} {:>10} {:>9} {:>9}  {} .. {}\n", x.name, x.numel,
                     x.compute, x.grad_norm, pct(x.rel_diff_first), pct(x.rel_diff_rounding), pct(x.rel_diff_max),
                     pct(x.underflow), pct(x.overflow), format_scale(x.safe.lo), format_scale(x.safe.hi));
  if (measured(rel_diff_total)) {
    // A non-finite difference (the mixed-precision gradient overflowed) has no ratio to the baseline.
    const double ratio = rel_diff_total / std::max(rounding_diff_total, 1e-300);
    s += fmt::format(
        "\nwhole gradient (all tensors), first step: {} relative difference from fp32 (rounding baseline {}{})",
        pct(rel_diff_total), pct(rounding_diff_total),
        std::isfinite(ratio) ? fmt::format(": {:.2f}x", ratio) : std::string(": not finite"));
  }
  s += fmt::format("\nall tensors: safe loss scales {} .. {}; recommended initial scale {}\n", format_scale(safe.lo),
                   format_scale(safe.hi), format_scale(recommended_scale));
  for (const std::string& p : problems) s += "problem: " + p + "\n";
  return s + verdict + "\n";
}

nlohmann::json DoctorReport::to_json() const {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json tj = nlohmann::json::array();
  for (const DoctorTensor& x : tensors)
    tj.push_back({{"name", x.name},
                  {"kind", x.kind},
                  {"compute", x.compute},
                  {"numel", x.numel},
                  {"grad_norm", x.grad_norm},
                  {"rel_diff_first", x.rel_diff_first < 0 ? nlohmann::json(nullptr) : num(x.rel_diff_first)},
                  {"rel_diff_max", x.rel_diff_max < 0 ? nlohmann::json(nullptr) : num(x.rel_diff_max)},
                  {"rel_diff_rounding", x.rel_diff_rounding < 0 ? nlohmann::json(nullptr) : num(x.rel_diff_rounding)},
                  {"underflow_fraction", x.underflow},
                  {"overflow_fraction", x.overflow},
                  {"safe_scale_lo", num(x.safe.lo)},
                  {"safe_scale_hi", num(x.safe.hi)}});
  return {{"model", model},
          {"level", level},
          {"half_dtype", half},
          {"mixed_ran", mixed_ran},
          {"not_run_why", not_run_why},
          {"precision", precision},
          {"backend", backend},
          {"activation_dtype", activation_dtype},
          {"bn_dtype", bn_dtype},
          {"loss_dtype", loss_dtype},
          {"master_dtype", master_dtype},
          {"convolutions", convs},
          {"fp32_arithmetic_convolutions", fp32_arithmetic_convs},
          {"fp32_output_convolutions", fp32_output_convs},
          {"batch_norms", bns},
          {"half_copy_batch_norms", half_copy_bns},
          {"loss_scale", loss_scale},
          {"loss_scale_policy", loss_scale_policy},
          {"steps", steps},
          {"overflow_skips", overflow_skips},
          {"final_loss_scale", final_scale},
          {"loss_fp32", loss_fp32},
          {"loss_mixed", loss_mixed},
          {"safe_scale_lo", num(safe.lo)},
          {"safe_scale_hi", num(safe.hi)},
          {"recommended_scale", num(recommended_scale)},
          {"rel_diff_total", rel_diff_total < 0 ? nlohmann::json(nullptr) : num(rel_diff_total)},
          {"rounding_diff_total", rounding_diff_total < 0 ? nlohmann::json(nullptr) : num(rounding_diff_total)},
          {"pass", pass},
          {"problems", problems},
          {"verdict", verdict},
          {"build", build_description()},
          {"tensors", tj}};
}

}  // namespace rn

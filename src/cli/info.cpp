// `resnet info`: parameters, forward MACs and planned training memory per level.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/format.h"
#include "core/check.h"
#include "dist/grad_buckets.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/stats.h"
#include "model/zoo.h"
#include "train/device.h"
#include "train/precision.h"

namespace rn::cli {

namespace {

struct InfoArgs {
  std::string model = "resnet50";
  std::string input;  // "": the model's own (model_options_for)
  int64_t batch = 32;
  int64_t classes = 0;  // 0: the model's own
  std::string dtype;    // "": fp32, or bf16 with --precision O1-O3
  std::string precision;  // "": O0 for fp32, O2 for a half dtype (as `resnet profile --dtype`)
  std::string device = "cpu";
  bool high_precision = false;
  bool params = false;
  int64_t fusion_threshold = 0;
};

// The parameter table in gradient-production order (the indices dist.bucket_boundaries
// takes) and, with a fusion threshold, the gradient buckets it makes.
void print_params(const Model& model, int64_t fusion_threshold) {
  const ParamTable& t = model.params();
  std::vector<int> bucket_of(t.params.size(), -1);
  std::vector<GradBucket> buckets;
  if (fusion_threshold > 0) {
    std::vector<GradRange> ranges;
    for (const ParamView& v : t.params) ranges.push_back({v.offset, v.numel});
    buckets = make_grad_buckets(ranges, fusion_threshold);
    for (size_t b = 0; b < buckets.size(); ++b)
      for (int p = buckets[b].first; p <= buckets[b].last; ++p) bucket_of[static_cast<size_t>(p)] = static_cast<int>(b);
  }
  fmt::print("\nParameters in gradient-production order (backward writes index 0 first):\n");
  fmt::print("  {:>5} {:<40} {:<18} {:>10} {:>10}{}\n", "index", "name", "shape", "elements", "offset",
             buckets.empty() ? "" : "  bucket");
  for (size_t i = 0; i < t.params.size(); ++i) {
    const ParamView& v = t.params[i];
    fmt::print("  {:>5} {:<40} {:<18} {:>10} {:>10}{}\n", i, v.name, v.shape.str(), v.numel, v.offset,
               buckets.empty() ? "" : fmt::format("  {}", bucket_of[i] + 1));
  }
  if (!buckets.empty()) {
    fmt::print("{} gradient buckets at dist.fusion_threshold {} bytes:\n", buckets.size(), fusion_threshold);
    for (size_t b = 0; b < buckets.size(); ++b)
      fmt::print("  bucket {:>3}: parameters {:>3}..{:<3} {:>10}\n", b + 1, buckets[b].first, buckets[b].last,
                 human_bytes(static_cast<double>(buckets[b].bytes())));
  }
}

int run_info(const InfoArgs& a) {
  // The device is checked before anything is printed; info also takes none (a dry plan).
  std::optional<DeviceChoice> device;
  if (a.device != "none") {
    try {
      device = device_from_name(a.device);
    } catch (const Error&) {
      RN_FAIL() << "--device '" << a.device << "': expected auto, cpu, ref, cuda or none (a dry plan)";
    }
  }
  const ModelOptions o = model_options_for(a.model, a.input, a.classes);
  Model model(build_model(a.model, o));
  const ModelStats st = model_stats(model.graph());
  // The precision level decides which tensors are half: --dtype bf16 alone plans O2 (bf16
  // activations), --precision O1 the bf16 convolutions between fp32 activations.
  const DType dt = compute_dtype_for(a.dtype, a.precision);
  PrecisionConfig pc;
  pc.level = precision_level_for(a.precision, dt);
  if (dt != DType::f32) pc.half_dtype = dt;
  fmt::print("model            {}\n", a.model);
  fmt::print("input            {}x{}x{}, {} classes\n", o.in_channels, o.height, o.width, o.num_classes);
  fmt::print("layers           {} conv, {} batch-norm, {} linear\n", st.conv_layers, st.bn_layers, st.linear_layers);
  fmt::print("parameters       {}\n", with_commas(model.param_count()));
  fmt::print("forward MACs     {} ({:.2f} GMACs per image)\n", with_commas(st.macs), st.macs / 1e9);
  fmt::print("training FLOPs   {:.2f} GFLOPs per image (forward + backward ~ 3x forward, 2 FLOPs per MAC)\n",
             6.0 * st.macs / 1e9);
  if (a.params || a.fusion_threshold > 0) print_params(model, a.fusion_threshold);
  // A backend makes the kernels, so that the shared workspace is known; the plans allocate no
  // arena (PlanOptions::allocate), so planning costs no memory and any batch can be planned.
  std::unique_ptr<Backend> backend;
  if (device) {
    BackendOptions bo;
    bo.high_precision = a.high_precision;
    backend = make_backend_for(*device, bo);
  }
  // Checked against the backend where there is one (fp16 on a CPU is refused with why).
  // The backend's refusal speaks in config keys; here the same choice is an option of info's.
  const PrecisionPolicy policy = [&] {
    if (!backend) return intended_precision_policy(pc);
    try {
      return make_precision_policy(pc, *backend);
    } catch (const Error& e) {
      RN_FAIL() << e.what() << " (with resnet info: another --dtype, or --device none to plan without kernels)";
    }
  }();
  const std::string dtypes = pc.level == PrecisionLevel::O0
                                 ? "fp32"
                                 : fmt::format("{} convolutions, {} activations", dtype_name(policy.conv_dtype),
                                               dtype_name(policy.activation_dtype));
  fmt::print("\nPlanned training memory at batch {}, precision {} ({}) ({}; parameters fp32 master, momentum SGD):\n",
             a.batch, enum_name(pc.level), dtypes,
             backend ? "kernels from " + backend->describe() : "dry plan, no workspace");
  fmt::print("  {:<6} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "level", "arena",
             "activations", "gradients", "params", "grads", "optimizer", "half w", "workspace", "total");
  auto b = [](size_t v) { return human_bytes(static_cast<double>(v)); };
  std::vector<std::string> peaks;
  for (MemoryLevel level : {MemoryLevel::O0, MemoryLevel::O1, MemoryLevel::O2}) {
    PlanOptions po;
    po.batch = a.batch;
    po.dtype = policy.conv_dtype;
    po.activation_dtype = policy.activation_dtype;
    po.memory = level;
    po.allocate = false;  // a plan to report, not to run: any batch, whatever this machine holds
    if (backend) po.layout = backend->preferred_layout();
    std::optional<Plan> built;
    try {
      built.emplace(model, backend.get(), po);
    } catch (const Error& e) {
      if (!backend || std::string_view(e.what()).find("out of") == std::string_view::npos) throw;
      RN_FAIL() << e.what() << "\n(the kernels of the " << backend->name() << " backend"
                << " allocate their workspace for this batch; --device none plans any batch without kernels, "
                   "leaving out the workspace)";
    }
    Plan& plan = *built;
    const PlannedPeak p = plan.planned_peak(1);
    const MemoryReport r = plan.memory();
    peaks.push_back(fmt::format("  {}: peak at step {} of {}, '{}'{}", memory_level_name(level), r.peak_step + 1,
                                plan.num_steps(), plan.step_names()[static_cast<size_t>(r.peak_step)],
                                r.recomputed_buffers > 0
                                    ? fmt::format(", {} values recomputed in backward", r.recomputed_buffers)
                                    : std::string()));
    fmt::print("  {:<6} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", memory_level_name(level),
               b(p.arena), b(p.activations), b(p.gradients), b(p.parameters), b(p.parameter_grads),
               b(p.optimizer_state), b(p.half_weights), backend ? b(p.workspace) : "-", b(p.total()));
  }
  fmt::print(
      "  arena: the planned peak of activations and activation gradients with the level's reuse;\n"
      "  activations, gradients: what is live in it at its peak step; O2 recomputes BN/ReLU outputs in "
      "backward\n");
  for (const std::string& line : peaks) fmt::print("{}\n", line);
  return 0;
}

}  // namespace

Runner add_info_command(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = app.add_subcommand("info", "Print a model's parameters, forward MACs and planned memory per level");
  cmd->add_option("--model", args->model, "Model name (resnet18/34/50/101/152, resnet20..110, resnet50_gdw)")
      ->capture_default_str();
  cmd->add_option("--input", args->input, kInputHelp);
  cmd->add_option("--batch", args->batch, "Batch size for the memory plan")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--classes", args->classes, kClassesHelp)->check(positive_number());
  cmd->add_option("--dtype", args->dtype,
                  "fp32, or the half dtype (bf16, fp16) of a mixed-precision plan (default: fp32; bf16 with "
                  "--precision O1-O3)");
  cmd->add_option("--precision", args->precision,
                  "Precision level O0-O3 (default: O0 for --dtype fp32, O2 for a half dtype; O1: half convolutions "
                  "between fp32 activations)");
  cmd->add_option("--device", args->device,
                  "Backend whose kernels size the workspace (cpu, ref, cuda, auto), or none for a dry plan")
      ->capture_default_str();
  cmd->add_flag("--high-precision", args->high_precision,
                "Size the workspace for run.implementation_mode=high_precision (on a CPU: no Winograd)");
  cmd->add_flag("--params", args->params, "Also list the parameters in gradient-production order");
  cmd->add_option(
      "--fusion-threshold", args->fusion_threshold,
      "The parameter table (as --params) with the gradient buckets this dist.fusion_threshold (bytes) makes");
  return [cmd, args]() -> int { return cmd->parsed() ? run_info(*args) : -1; };
}

}  // namespace rn::cli

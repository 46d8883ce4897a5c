// `resnet tune`: fills the GPU's convolution algorithm cache ahead of time. Making a
// training plan creates every convolution kernel, and the CUDA backend searches (and
// records, in memory and in its cache file) the fastest algorithm of each shape it has not
// seen; a later `resnet train` or `resnet bench` with the same model, batch, precision and
// mode then starts without searching.
#include <fmt/format.h>

#include <chrono>

#include "cli/commands.h"
#include "cli/format.h"
#include "model/plan.h"
#include "model/zoo.h"
#include "train/device.h"
#include "train/precision.h"

namespace rn::cli {
namespace {

struct TuneArgs {
  std::string model = "resnet50";
  std::string input;    // "": the model's own (model_options_for)
  int64_t classes = 0;  // 0: the model's own
  std::vector<int64_t> batches = {256};
  std::string precision = "O2";
  std::string half = "fp16";
  std::string device = "cuda";
  bool high_precision = false;
  bool deterministic = false;
};

int run_tune(const TuneArgs& a) {
  const ModelOptions o = model_options_for(a.model, a.input, a.classes);
  Model model(build_model(a.model, o));
  BackendOptions bo;
  bo.high_precision = a.high_precision;
  bo.deterministic = a.deterministic;
  auto backend = make_backend_for(device_from_name(a.device), bo);
  RN_CHECK(backend->device() != Device::cpu)
      << "resnet tune: the " << backend->name() << " backend keeps no algorithm cache (tuning is for --device cuda)";
  PrecisionConfig pc;
  pc.level = parse_enum(a.precision, {PrecisionLevel::O0, PrecisionLevel::O1, PrecisionLevel::O2, PrecisionLevel::O3},
                        "precision level");
  pc.half_dtype = compute_dtype_from_name(a.half, "--half", /*half_only=*/true);
  const PrecisionPolicy policy = make_precision_policy(pc, *backend);
  for (int64_t batch : a.batches) {
    const auto t0 = std::chrono::steady_clock::now();
    PlanOptions po;
    po.batch = batch;
    po.dtype = policy.conv_dtype;
    po.activation_dtype = policy.activation_dtype;
    po.layout = backend->preferred_layout();
    Plan plan(model, backend.get(), po);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("{} batch {} ({}): planned in {:.1f} s\n", a.model, batch, policy.describe(), s);
  }
  fmt::print("{}\n", backend->tuning_state());
  return 0;
}

}  // namespace

Runner add_tune_command(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  CLI::App* cmd =
      app.add_subcommand("tune", "Search and cache the GPU convolution algorithms of a model ahead of time");
  cmd->add_option("--model", a->model, "Model name")->capture_default_str();
  cmd->add_option("--input", a->input, kInputHelp);
  cmd->add_option("--classes", a->classes, kClassesHelp)->check(positive_number());
  cmd->add_option("--batch", a->batches, "Batch size (repeatable)")->capture_default_str();
  cmd->add_option("--precision", a->precision, "Precision level O0, O1, O2, O3")->capture_default_str();
  cmd->add_option("--half", a->half, "Half dtype for O1-O3: bf16 or fp16")->capture_default_str();
  cmd->add_option("--device", a->device, "cuda (or auto)")->capture_default_str();
  cmd->add_flag("--high-precision", a->high_precision,
                "Tune for run.implementation_mode=high_precision (deterministic algorithms only)");
  cmd->add_flag("--deterministic", a->deterministic,
                "Tune for run.deterministic=true (deterministic algorithms only; a run in high_performance mode "
                "with it has keys of its own)");
  return [cmd, a]() -> int { return cmd->parsed() ? run_tune(*a) : -1; };
}

}  // namespace rn::cli

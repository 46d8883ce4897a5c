// The troubleshooting commands (docs/troubleshooting.md):
//   resnet doctor  --config X [--set k=v] [--data DIR] [--steps K] [--json PATH]   precision doctor; exit 2 past
//   thresholds resnet profile --model M --batch B [--dtype] [--precision] [--device] [--trace PATH] [--json PATH]
//   resnet summary RUN_A [RUN_B] [--tolerance T]                       gradient-monitor summary / comparison
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/format.h"
#include "core/atomic_file.h"
#include "train/config.h"
#include "train/device.h"
#include "train/doctor.h"
#include "train/layer_profile.h"
#include "train/run_summary.h"

namespace rn::cli {

namespace {

struct DoctorArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string data;
  int steps = 3;
  std::string json = "doctor.json";
};

int run_doctor_cmd(const DoctorArgs& a) {
  std::vector<std::string> sets = data_sets(a.data, !a.config.empty(), a.sets);  // --set wins
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  const Config cfg = load_config(a.config, sets);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  const DoctorReport r = run_doctor(cfg, {.steps = a.steps});
  fmt::print("{}", r.table());
  if (!a.json.empty()) {
    write_file_atomic(a.json, r.to_json().dump(2) + "\n");
    fmt::print("wrote {}\n", a.json);
  }
  return r.pass ? 0 : 2;
}

struct ProfileArgs {
  std::string model = "resnet50";
  std::string input;    // "": the model's own (model_options_for)
  int64_t classes = 0;  // 0: the model's own
  int64_t batch = 32;
  std::string dtype;      // "": fp32, or bf16 with --precision O1-O3
  std::string precision;  // "": O0 for fp32, O2 for a half dtype
  std::string device = "auto";
  std::string memory = "O1";
  bool high_precision = false;
  std::string bf16_conv_arithmetic = "auto";
  int steps = 5, warmup = 2, threads = 0, top = 30;
  std::string trace = "profile_trace.json";
  std::string json;
};

int run_profile_cmd(const ProfileArgs& a) {
  ProfileOptions o;
  o.model = a.model;
  const ModelOptions mo = model_options_for(a.model, a.input, a.classes);
  o.channels = mo.in_channels, o.height = mo.height, o.width = mo.width;
  o.classes = mo.num_classes;
  o.batch = a.batch;
  o.dtype = compute_dtype_for(a.dtype, a.precision);
  o.precision = precision_level_for(a.precision, o.dtype);
  o.device = device_from_name(a.device);
  o.high_precision = a.high_precision;
  o.bf16_conv_arithmetic = bf16_conv_arithmetic_from_name(a.bf16_conv_arithmetic);
  o.memory = memory_level_from_name(a.memory);
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.threads = a.threads;
  if (!a.trace.empty()) check_output_path(a.trace, "--trace");
  if (!a.json.empty()) check_output_path(a.json, "--json");
  const ProfileReport r = run_profile(o);
  fmt::print("{}", r.table(a.top));
  if (!a.trace.empty()) {
    r.write_trace(a.trace);
    fmt::print("wrote {} (chrome://tracing or ui.perfetto.dev)\n", a.trace);
  }
  if (!a.json.empty()) {
    write_file_atomic(a.json, r.to_json().dump(2) + "\n");
    fmt::print("wrote {}\n", a.json);
  }
  return 0;
}

struct SummaryArgs {
  std::vector<std::string> runs;
  double tolerance = 1e-3;
};

int run_summary_cmd(const SummaryArgs& a) {
  RN_CHECK(a.runs.size() == 1 || a.runs.size() == 2) << "summary: give one run folder, or two to compare";
  const auto first = read_grad_summary(grad_summary_path(a.runs[0]));
  if (a.runs.size() == 1) {
    fmt::print("{}", summarize_grad_run(first));
    return 0;
  }
  const auto second = read_grad_summary(grad_summary_path(a.runs[1]));
  fmt::print("run A: {}\nrun B: {}\n", a.runs[0], a.runs[1]);
  const RunComparison c = compare_grad_runs(first, second, a.tolerance);
  fmt::print("{}", c.text());
  return 0;
}

}  // namespace

Runner add_doctor_command(CLI::App& app) {
  auto a = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "Precision doctor: the same batches from the same weights in fp32 and at the configured precision level; "
      "per-tensor gradient differences, half-precision underflow/overflow at the loss scale, a recommended scale. "
      "Exit status 2 when diagnostics.doctor_max_* thresholds are passed");
  cmd->add_option("--config", a->config, "YAML config (default: the built-in resnet20 Fashion-MNIST recipe)");
  cmd->add_option("--set", a->sets, "Override a config key, e.g. --set precision.level=O2 (repeatable)");
  cmd->add_option("--data", a->data,
                  "Check on an image folder (or a packed one), as resnet train --data reads it: ImageNet's "
                  "normalisation, RGB, and without --config as many outputs as it has classes; --set wins");
  cmd->add_option("--steps", a->steps, "Training steps compared")->capture_default_str()->check(positive_number());
  cmd->add_option("--json", a->json, "Write the report as JSON here (empty: do not)")->capture_default_str();
  return [cmd, a]() -> int { return cmd->parsed() ? run_doctor_cmd(*a) : -1; };
}

Runner add_profile_command(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Per-layer profile of one training step on synthetic data: time, MACs, bytes, achieved rate and bandwidth, "
      "bounding roof against peaks measured at start; a sorted table and a Chrome trace");
  cmd->add_option("--model", a->model, "Model name")->capture_default_str();
  cmd->add_option("--input", a->input, kInputHelp);
  cmd->add_option("--classes", a->classes, kClassesHelp)->check(positive_number());
  cmd->add_option("--batch", a->batch, "Batch size")->capture_default_str()->check(positive_number());
  cmd->add_option("--dtype", a->dtype,
                  "fp32 (precision O0), bf16 or fp16 (precision O2 unless --precision); default fp32, or bf16 with "
                  "--precision O1-O3");
  cmd->add_option("--precision", a->precision,
                  "Precision level O0-O3 (default: O0 for --dtype fp32, O2 for a half dtype; O1: half convolutions "
                  "between fp32 activations)");
  cmd->add_option("--device", a->device, "auto, cpu, ref or cuda")->capture_default_str();
  cmd->add_option("--memory-level", a->memory, "Memory level O0, O1 or O2")->capture_default_str();
  cmd->add_flag("--high-precision", a->high_precision,
                "run.implementation_mode=high_precision: deterministic algorithms on a GPU, no Winograd on a CPU");
  cmd->add_option("--bf16-conv-arithmetic", a->bf16_conv_arithmetic, kBf16ConvArithmeticHelp)->capture_default_str();
  cmd->add_option("--steps", a->steps, "Profiled steps (and as many unprofiled)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")->capture_default_str()->check(non_negative_number());
  cmd->add_option("--threads", a->threads, "Host threads (0: all cores)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--top", a->top, "Rows shown (0: all layers)")->capture_default_str();
  cmd->add_option("--trace", a->trace, "Chrome trace of the mean step (empty: none)")->capture_default_str();
  cmd->add_option("--json", a->json, "Write the profile as JSON here");
  return [cmd, a]() -> int { return cmd->parsed() ? run_profile_cmd(*a) : -1; };
}

Runner add_summary_command(CLI::App& app) {
  auto a = std::make_shared<SummaryArgs>();
  CLI::App* cmd = app.add_subcommand(
      "summary",
      "Gradient-monitor summary of a run (its first epoch), or a comparison of two runs naming the tensors that "
      "diverge first");
  cmd->add_option("runs", a->runs, "RUN_A [RUN_B]: run folders (or grad_summary.jsonl files)")
      ->required()
      ->expected(1, 2);
  cmd->add_option("--tolerance", a->tolerance, "Relative difference of norms that counts as divergence")
      ->capture_default_str()
      ->check(positive_number());
  return [cmd, a]() -> int { return cmd->parsed() ? run_summary_cmd(*a) : -1; };
}

}  // namespace rn::cli

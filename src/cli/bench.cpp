// `resnet bench`: training throughput on synthetic data (no dataset needed). One step is
// exactly what `resnet train` runs: forward, backward, overflow check, fused optimizer.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/bench_data.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/zoo.h"
#include "train/device.h"
#include "train/precision.h"
#include "train/train_step.h"

namespace rn::cli {

namespace {

struct BenchArgs {
  std::string model = "resnet50";
  std::string input = "3x224x224";
  int64_t classes = 1000;
  int64_t batch = 16;
  std::string precision = "O0";
  std::string half = "bf16";
  std::string device = "auto";
  std::string memory = "O1";
  int steps = 10;
  int warmup = 2;
  int threads = 0;
  bool json = false;
  bool profile = false;
};

template <typename E>
E parse_enum(const std::string& s, std::initializer_list<E> values, const char* what) {
  for (E v : values)
    if (enum_name(v) == s) return v;
  RN_FAIL() << "unknown " << what << " '" << s << "'";
}

void print_step_profile(const Plan& plan, int runs) {
  const auto names = plan.step_names();
  const auto& secs = plan.step_seconds();
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return secs[x] > secs[y]; });
  double total = 0;
  for (double s : secs) total += s;
  fmt::print("plan steps by time (mean over {} runs, total {:.3f} s per step):\n", runs, total / runs);
  for (size_t k = 0; k < std::min<size_t>(order.size(), 25); ++k)
    fmt::print("  {:8.3f} ms {:5.1f}%  {}\n", 1e3 * secs[order[k]] / runs, 100 * secs[order[k]] / total,
               names[order[k]]);
}

int run_bench(const BenchArgs& a) {
  set_host_threads(a.threads);
  ModelOptions o;
  parse_input_shape(a.input, &o.in_channels, &o.height, &o.width);
  o.num_classes = a.classes;
  Model model(build_model(a.model, o));
  model.init(1);
  auto backend = make_backend_for(device_from_name(a.device));
  PrecisionConfig pc;
  pc.level = parse_enum(a.precision, {PrecisionLevel::O0, PrecisionLevel::O1, PrecisionLevel::O2, PrecisionLevel::O3},
                        "precision level");
  pc.half_dtype = dtype_from_name(a.half);
  const PrecisionPolicy policy = make_precision_policy(pc, *backend);

  PlanOptions po;
  po.batch = a.batch;
  po.dtype = policy.conv_dtype;
  po.activation_dtype = policy.activation_dtype;
  po.layout = backend->preferred_layout();
  po.memory = memory_level_from_name(a.memory);
  Plan plan(model, backend.get(), po);
  OptimizerConfig oc;
  ParamTable table = model.params();
  apply_optimizer_param_policy(table, oc);
  Optimizer opt(oc, table);
  LossScaler scaler(policy.loss_scale);
  TrainStep step(plan, opt, scaler, policy);

  // Synthetic batch: normal pixels, uniform labels (fixed, as in the PyTorch side).
  Rng rng(7);
  const Tensor in = plan.input();
  std::vector<float> pixels(static_cast<size_t>(in.numel()));
  for (float& v : pixels) v = rng.normal();
  convert(in.data, in.dtype, pixels.data(), DType::f32, pixels.size());
  for (int64_t i = 0; i < a.batch; ++i) plan.labels().ptr<int32_t>()[i] = static_cast<int32_t>(rng.below(a.classes));

  plan.set_profiling(a.profile);
  std::vector<double> times;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step.run(0.01);
    backend->synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= a.warmup) times.push_back(s);
  }
  if (a.profile) print_step_profile(plan, a.steps + a.warmup);
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  if (a.json) {
    fmt::print(
        "{{\"system\":\"resnet.cpp\",\"model\":\"{}\",\"precision\":\"{}\",\"half\":\"{}\",\"batch\":{},"
        "\"device\":\"{}\",\"threads\":{},\"median_step_s\":{:.6f},\"images_per_sec\":{:.3f},\"steps\":{}}}\n",
        a.model, a.precision, a.half, a.batch, backend->name(), host_threads(), median, a.batch / median, times.size());
  } else {
    fmt::print("{} | {} | batch {} | {} | {} threads | arena {} | median step {:.3f} s | {:.2f} img/s ({} steps)\n",
               a.model, policy.describe(), a.batch, backend->name(), host_threads(),
               human_bytes(static_cast<double>(plan.memory().arena_bytes)), median, a.batch / median, times.size());
  }
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure training throughput on synthetic data");
  cmd->add_option("--model", a->model, "Model name")->capture_default_str();
  cmd->add_option("--input", a->input, "Input shape CxHxW")->capture_default_str();
  cmd->add_option("--classes", a->classes, "Number of classes")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Batch size")->capture_default_str();
  cmd->add_option("--precision", a->precision, "Precision level O0, O1, O2, O3")->capture_default_str();
  cmd->add_option("--half", a->half, "Half dtype for O1-O3: bf16 or fp16")->capture_default_str();
  cmd->add_option("--device", a->device, "auto, cpu, ref or cuda")->capture_default_str();
  cmd->add_option("--memory-level", a->memory, "Memory level O0 or O1")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", a->threads, "Host threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON line");
  cmd->add_flag("--profile", a->profile, "Time every plan step and print the slowest");
  // The input pipeline alone.
  auto d = std::make_shared<DataBenchArgs>();
  cmd->add_option("--data", d->path, "Benchmark the loader alone on this image folder (no model)");
  cmd->add_option("--workers", d->workers, "--data: loader threads (0: one per host thread)");
  cmd->add_option("--batches", d->batches, "--data: timed batches (0: one epoch)");
  cmd->add_flag("--eval-transform", d->eval, "--data: resize + centre crop instead of RandomResizedCrop + flip");
  cmd->add_flag("--normalize", d->normalize, "--data: f32 NCHW batches (the CPU training path) instead of u8 NHWC");
  cmd->add_flag("!--no-dct-scaling", d->dct_scaling, "--data: decode JPEGs at full size");
  cmd->add_option("--cache-mb", d->cache_mb, "--data: decoded-image cache (MiB)");
  cmd->add_option("--epochs", d->epochs, "--data: epochs to run; only the last is timed (fills the cache first)");
  cmd->add_option("--trace", d->trace, "--data: write a Chrome trace of the loader here");
  return [cmd, a, d]() -> int {
    if (!cmd->parsed()) return -1;
    if (d->path.empty()) return run_bench(*a);
    set_host_threads(a->threads);
    d->batch = cmd->count("--batch") > 0 ? a->batch : 256;  // the model's default batch (16) is too small here
    int64_t c = 0, h = 0, w = 0;
    parse_input_shape(a->input, &c, &h, &w);
    d->height = static_cast<int>(h);
    d->width = static_cast<int>(w);
    d->warmup = a->warmup;
    d->json = a->json;
    return run_data_bench(*d);
  };
}

}  // namespace rn::cli

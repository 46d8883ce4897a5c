// `resnet bench`: training throughput on synthetic data (no dataset needed). One step is
// exactly what `resnet train` runs: forward, backward, overflow check, fused optimizer.
// Each result also gives the planned memory (arena, and the total with parameters, their
// gradients, momentum and workspace) and the measured one (the arena's high-water mark and
// the process's peak RSS). --find-max-batch --memory-cap BYTES finds, per memory level, the
// largest batch whose planned total fits the cap, and times it.
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/bench_data.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "core/build_info.h"
#include "core/memory_space.h"
#include "core/plural.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/memory_usage.h"
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
  std::string input;    // "": the model's own (model_options_for)
  int64_t classes = 0;  // 0: the model's own
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
  bool find_max_batch = false;
  std::string memory_cap;
  int sink = 0;  // device: replay the step as a CUDA graph, timing sink-step windows
  bool high_precision = false;  // run.implementation_mode=high_precision
  std::string bf16_conv_arithmetic = "auto";  // run.cpu_bf16_conv_arithmetic
  bool unfused_casts = false;                 // PlanOptions::fuse_conv_casts off (to measure it)
};

// `out`: stdout, or stderr under --json (whose stdout holds JSON lines only).
void print_step_profile(const Plan& plan, int runs, std::FILE* out) {
  const auto names = plan.step_names();
  const auto& secs = plan.step_seconds();
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return secs[x] > secs[y]; });
  double total = 0;
  for (double s : secs) total += s;
  fmt::print(out, "plan steps by time (mean over {} runs, total {:.3f} s per step):\n", runs, total / runs);
  // By kind (the first word of the name: fwd, bwd, bwd_weights, recompute, ...), in first-seen order.
  std::vector<std::pair<std::string, double>> kinds;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string kind = names[i].substr(0, names[i].find(' '));
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), {kind, 0.0});
    it->second += secs[i];
  }
  for (const auto& [kind, t] : kinds)
    fmt::print(out, "  {:8.3f} ms {:5.1f}%  all {} steps\n", 1e3 * t / runs, 100 * t / total, kind);
  for (size_t k = 0; k < std::min<size_t>(order.size(), 25); ++k)
    fmt::print(out, "  {:8.3f} ms {:5.1f}%  {}\n", 1e3 * secs[order[k]] / runs, 100 * secs[order[k]] / total,
               names[order[k]]);
}

// Everything one level's benchmark needs besides the plan options.
struct BenchSetup {
  Model& model;
  Backend& backend;
  const PrecisionPolicy& policy;
  const BenchArgs& args;
};

struct BenchResult {
  int64_t batch = 0;
  double median_step_s = 0;
  PlannedPeak planned;
  RangeResidency arena;        // measured: what the steps touched of the arena
  size_t peak_resident = 0;    // measured: the process's peak RSS while the plan lived
  size_t resident_growth = 0;  // measured: that peak minus the RSS before the plan was made
  size_t device_peak = 0;      // device backends: peak bytes allocated on the device
};

PlanOptions plan_options(const BenchSetup& s, int64_t batch, MemoryLevel level) {
  PlanOptions po;
  po.batch = batch;
  po.dtype = s.policy.conv_dtype;
  po.activation_dtype = s.policy.activation_dtype;
  po.layout = s.backend.preferred_layout();
  po.memory = level;
  po.fuse_conv_casts = !s.args.unfused_casts;
  return po;
}

// Plans, fills a synthetic batch and times training steps at one batch size and level.
BenchResult bench_plan(const BenchSetup& s, int64_t batch, MemoryLevel level) {
  const BenchArgs& a = s.args;
  malloc_trim(0);  // earlier plans' freed memory goes back first, so the growth below is this plan's
  reset_peak_resident();
  const size_t base = process_memory().resident;
  Plan plan(s.model, &s.backend, plan_options(s, batch, level));
  OptimizerConfig oc;
  ParamTable table = s.model.params();
  apply_optimizer_param_policy(table, oc);
  Optimizer opt(oc, table);
  LossScaler scaler(s.policy.loss_scale);
  TrainStep step(plan, opt, scaler, s.policy, a.sink);
  if (a.sink > 0) step.set_lr_source([](int64_t) { return 0.01; }, 0);

  {  // Synthetic batch: normal pixels, uniform labels (fixed, as in the PyTorch side).
    Rng rng(7);
    const Tensor in = plan.input();
    std::vector<float> pixels(static_cast<size_t>(in.numel()));
    for (float& v : pixels) v = rng.normal();
    HostTensor staged(in.shape, in.dtype, in.layout);
    convert(staged.view().data, in.dtype, pixels.data(), DType::f32, pixels.size());
    plan.copy_from_host(in, staged.view().data);
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(a.classes));
    plan.copy_from_host(plan.labels(), labels.data());
  }

  plan.set_profiling(a.profile && a.warmup == 0);  // the warmup steps are not timed
  std::vector<double> times;
  if (a.sink > 0) {
    // Graph replays: the host waits once per window of `sink` steps; the step time is the
    // window's time over its steps. The warm-up ends on a window boundary, so that each timed
    // window is one of the step's own (its learning-rate table is uploaded and its losses
    // read back between windows, not inside a timed one).
    const int warm = (std::max(a.warmup, 1) + a.sink - 1) / a.sink * a.sink;
    for (int i = 0; i < warm; ++i) step.run(0.01);
    s.backend.synchronize();
    for (int done = 0; done < a.steps;) {
      const int n = std::min(a.sink, a.steps - done);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) step.run(0.01);
      s.backend.synchronize();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int i = 0; i < n; ++i) times.push_back(secs / n);
      done += n;
    }
  }
  for (int i = 0; i < (a.sink > 0 ? 0 : a.warmup + a.steps); ++i) {
    if (a.profile && i == a.warmup && i > 0) plan.set_profiling(true);
    const auto t0 = std::chrono::steady_clock::now();
    step.run(0.01);
    s.backend.synchronize();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= a.warmup) times.push_back(secs);
  }
  if (a.profile) print_step_profile(plan, a.steps, a.json ? stderr : stdout);
  std::sort(times.begin(), times.end());
  BenchResult r;
  r.batch = batch;
  r.median_step_s = times[times.size() / 2];
  r.planned = plan.planned_peak(1);
  r.arena = plan.arena_residency();
  const ProcessMemory pm = process_memory();
  r.peak_resident = pm.peak_resident;
  r.resident_growth = pm.peak_resident > base ? pm.peak_resident - base : 0;
  r.device_peak = s.backend.memory().peak_bytes();
  return r;
}

void print_result(const BenchSetup& s, MemoryLevel level, const BenchResult& r) {
  const BenchArgs& a = s.args;
  auto hb = [](size_t v) { return human_bytes(static_cast<double>(v)); };
  const char* mode = a.high_precision ? "high_precision" : "high_performance";
  // A bf16 arithmetic asked for is part of what was measured (auto's choice is in the log).
  const std::string mode_shown = a.bf16_conv_arithmetic == "auto" || s.backend.device() != Device::cpu
                                     ? std::string(mode)
                                     : fmt::format("{}, bf16 convolutions {}", mode, a.bf16_conv_arithmetic);
  // Half convolutions among fp32 activations (O1): where PlanOptions::fuse_conv_casts applies.
  const bool o1 = s.policy.conv_dtype != DType::f32 && s.policy.activation_dtype == DType::f32;
  const bool fused_conv_casts = o1 && !a.unfused_casts && s.backend.conv_f32_outputs();
  if (a.json) {
    fmt::print(
        "{{\"system\":\"resnet.cpp\",\"model\":\"{}\",\"precision\":\"{}\",\"half\":\"{}\",\"batch\":{},"
        "\"device\":\"{}\",\"threads\":{},\"memory_level\":\"{}\",\"median_step_s\":{:.6f},"
        "\"images_per_sec\":{:.3f},\"steps\":{},\"planned_arena\":{},\"planned_total\":{},"
        "\"arena_high_water\":{},\"peak_resident\":{},\"resident_growth\":{},\"device_peak\":{},\"sink\":{},"
        "\"implementation_mode\":\"{}\",\"cpu_bf16_conv_arithmetic\":\"{}\",\"host_huge_page_bytes\":{},"
        "\"fused_conv_casts\":{},\"build\":{}}}\n",
        a.model, a.precision, a.half, r.batch, s.backend.name(), host_threads(), memory_level_name(level),
        r.median_step_s, r.batch / r.median_step_s, a.steps, r.planned.arena, r.planned.total(), r.arena.high_water,
        r.peak_resident, r.resident_growth, r.device_peak, a.sink, mode, a.bf16_conv_arithmetic, host_huge_page_bytes(),
        fused_conv_casts, nlohmann::json(build_description()).dump());
  } else {
    // On a device the arena is device memory: its peak is measured by the device's allocator,
    // not by the host's page residency.
    const bool device = s.backend.device() != Device::cpu;
    fmt::print(
        "{} | {} | batch {} | {} ({}) | {} | memory {} | planned arena {}, total {} | measured {}, peak RSS {} "
        "(+{}) | median step {:.3f} s | {:.2f} img/s ({} steps)\n",
        a.model, s.policy.describe(), r.batch, s.backend.name(),
        o1 && a.unfused_casts ? mode_shown + ", casts unfused" : mode_shown, counted(host_threads(), "thread"),
        memory_level_name(level), hb(r.planned.arena), hb(r.planned.total()),
        device ? "device peak " + hb(r.device_peak) : "arena high-water " + hb(r.arena.high_water), hb(r.peak_resident),
        hb(r.resident_growth), r.median_step_s, r.batch / r.median_step_s, a.steps);
  }
}

ModelOptions bench_model_options(const BenchArgs& a) { return model_options_for(a.model, a.input, a.classes); }

std::unique_ptr<Backend> bench_backend(const BenchArgs& a) {
  BackendOptions bo;
  bo.high_precision = a.high_precision;
  bo.cpu_bf16_conv_arithmetic = bf16_conv_arithmetic_from_name(a.bf16_conv_arithmetic);
  return make_backend_for(device_from_name(a.device), bo);
}

// The planned total at `batch`: a dry plan (no workspace), or with kernels, made on a fresh
// backend of the same kind: a backend's workspace only grows (it serves every kernel it
// made), so a larger batch tried before would otherwise stay in the figure.
// The fresh backend gets a model of its own too: a plan places its model on its backend's
// device memory, which the benchmarked model must not end up on.
size_t planned_total(const BenchSetup& s, int64_t batch, MemoryLevel level, bool with_kernels) {
  if (!with_kernels) return Plan(s.model, nullptr, plan_options(s, batch, level)).planned_peak(1).total();
  const auto backend = bench_backend(s.args);
  Model probe(build_model(s.args.model, bench_model_options(s.args)));
  return Plan(probe, backend.get(), plan_options(s, batch, level)).planned_peak(1).total();
}

// The largest batch whose planned total fits `cap`, or 0 when not even batch 1 does.
// Dry plans find it fast (the planned total grows with the batch); a plan with kernels then
// adds the backend's workspace and steps down while that overflows.
// On the cuda backend no convolution tensor may pass cuDNN's element limit: the largest
// batch for which none does (0: no limit).
int64_t cudnn_batch_limit(const BenchSetup& s) {
  if (s.backend.device() != Device::cuda) return 0;
  const Graph& g = s.model.graph();
  int64_t per_sample = 1;
  for (const Node& n : g.nodes())
    if (attrs_if<ConvAttrs>(n))
      per_sample = std::max({per_sample, n.shape.numel(), g.node(n.inputs.at(0)).shape.numel()});
  return kCudnnMaxTensorElements / per_sample;
}

int64_t max_batch_under(const BenchSetup& s, MemoryLevel level, size_t cap) {
  const int64_t cudnn_limit = cudnn_batch_limit(s);
  auto fits = [&](int64_t b) {
    return (cudnn_limit == 0 || b <= cudnn_limit) && planned_total(s, b, level, false) <= cap;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  constexpr int64_t kLimit = int64_t{1} << 20;
  while (hi <= kLimit && fits(hi)) lo = hi, hi *= 2;
  if (hi > kLimit) return lo;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  while (lo > 0 && planned_total(s, lo, level, true) > cap) --lo;
  return lo;
}

int find_max_batch(const BenchSetup& s, size_t cap) {
  const MemoryLevel levels[] = {MemoryLevel::O0, MemoryLevel::O1, MemoryLevel::O2};
  int64_t found[3] = {};
  for (MemoryLevel level : levels) found[static_cast<int>(level)] = max_batch_under(s, level, cap);
  if (found[static_cast<int>(MemoryLevel::O2)] == 0) {
    RN_FAIL() << "--memory-cap " << cap << " (" << human_bytes(static_cast<double>(cap))
              << ") is too small for batch 1 of " << s.args.model << " " << s.args.input
              << " at any memory level: O2 needs "
              << human_bytes(static_cast<double>(planned_total(s, 1, MemoryLevel::O2, true)));
  }
  if (!s.args.json) {
    fmt::print("largest batch whose planned total fits {} ({} bytes), per memory level:\n",
               human_bytes(static_cast<double>(cap)), cap);
    const int64_t cudnn_limit = cudnn_batch_limit(s);
    for (int64_t b : found)
      if (cudnn_limit > 0 && b == cudnn_limit) {
        fmt::print(
            "(batch {} is the most cuDNN allows this model: its largest convolution tensor reaches 2^31 - 1 "
            "elements there)\n",
            cudnn_limit);
        break;
      }
  }
  for (MemoryLevel level : levels) {
    const int64_t b = found[static_cast<int>(level)];
    if (b == 0) {
      const size_t need = planned_total(s, 1, level, true);
      if (s.args.json)
        fmt::print("{{\"memory_level\":\"{}\",\"batch\":0,\"batch1_needs\":{}}}\n", memory_level_name(level), need);
      else
        fmt::print("{}: does not fit batch 1 (needs {})\n", memory_level_name(level),
                   human_bytes(static_cast<double>(need)));
      continue;
    }
    // Timed on a fresh backend and model: a backend's workspace serves every kernel it made, so
    // the levels timed before would otherwise stay in this one's workspace (and its total could
    // pass the cap that its own plan fits).
    const auto backend = bench_backend(s.args);
    Model model(build_model(s.args.model, bench_model_options(s.args)));
    model.init(1);
    const BenchSetup fresh{model, *backend, s.policy, s.args};
    print_result(fresh, level, bench_plan(fresh, b, level));
  }
  return 0;
}

int run_bench(const BenchArgs& a) {
  set_host_threads(a.threads);
  const ModelOptions o = bench_model_options(a);
  const MemoryLevel level = memory_level_from_name(a.memory);  // checked before any work
  RN_CHECK(!a.find_max_batch || !a.memory_cap.empty()) << "--find-max-batch needs --memory-cap BYTES";
  RN_CHECK(a.sink == 0 || !a.profile) << "--profile times every plan step with a device synchronisation, which a "
                                         "captured graph (--sink) cannot hold; use one or the other";
  RN_CHECK(a.find_max_batch || a.memory_cap.empty()) << "--memory-cap is only used with --find-max-batch";
  const size_t cap = a.memory_cap.empty() ? 0 : parse_bytes(a.memory_cap, "--memory-cap");
  Model model(build_model(a.model, o));
  model.init(1);
  auto backend = bench_backend(a);
  PrecisionConfig pc;
  pc.level = parse_enum(a.precision, {PrecisionLevel::O0, PrecisionLevel::O1, PrecisionLevel::O2, PrecisionLevel::O3},
                        "precision level");
  pc.half_dtype = compute_dtype_from_name(a.half, "--half", /*half_only=*/true);
  const PrecisionPolicy policy = make_precision_policy(pc, *backend);
  const BenchSetup setup{model, *backend, policy, a};
  if (a.find_max_batch) return find_max_batch(setup, cap);
  print_result(setup, level, bench_plan(setup, a.batch, level));
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure training throughput on synthetic data");
  cmd->add_option("--model", a->model, "Model name")->capture_default_str();
  cmd->add_option("--input", a->input, kInputHelp);
  cmd->add_option("--classes", a->classes, kClassesHelp)->check(positive_number());
  cmd->add_option("--batch", a->batch, "Batch size (with --data: 256 unless given)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--precision", a->precision, "Precision level O0, O1, O2, O3")->capture_default_str();
  cmd->add_option("--half", a->half, "Half dtype for O1-O3: bf16 or fp16")->capture_default_str();
  cmd->add_option("--device", a->device, "auto, cpu, ref or cuda")->capture_default_str();
  cmd->add_option("--memory-level", a->memory, "Memory level O0, O1 or O2")->capture_default_str();
  cmd->add_flag("--find-max-batch", a->find_max_batch,
                "For each memory level, find the largest batch whose planned memory fits --memory-cap and time it");
  cmd->add_option("--memory-cap", a->memory_cap,
                  "Memory budget for --find-max-batch: bytes, or with a binary unit (8G, 1.5GiB, 512MiB)");
  cmd->add_option("--steps", a->steps, "Timed steps")->capture_default_str()->check(positive_number());
  cmd->add_option("--warmup", a->warmup, "Untimed steps first (with --sink, rounded up to a multiple of it)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--threads", a->threads, "Host threads (0: all cores)")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_flag("--json", a->json,
                "Print the result as one JSON line (--find-max-batch: one per memory level; a level that does not fit "
                "batch 1: {\"memory_level\", \"batch\": 0, \"batch1_needs\"}); --profile's table then goes to "
                "stderr");
  cmd->add_flag("--high-precision", a->high_precision,
                "run.implementation_mode=high_precision: deterministic algorithms on a GPU, no Winograd on a CPU");
  cmd->add_option("--bf16-conv-arithmetic", a->bf16_conv_arithmetic, kBf16ConvArithmeticHelp)->capture_default_str();
  cmd->add_flag("--profile", a->profile, "Time every plan step and print the slowest");
  cmd->add_flag("--unfused-casts", a->unfused_casts,
                "O1: cast between the half convolutions and the fp32 activations in passes of their own instead "
                "of the convolutions writing fp32 and the batch norms writing half copies (to measure the fusion)");
  cmd->add_option("--sink", a->sink, "GPU: replay the step as a CUDA graph, synchronising every N steps (0: eager)")
      ->capture_default_str()
      ->check(non_negative_number());
  // The input pipeline alone.
  auto d = std::make_shared<DataBenchArgs>();
  cmd->add_option("--data", d->path, "Benchmark the loader alone on this image folder (no model)");
  cmd->add_option("--workers", d->workers, "--data: loader threads (0: one per host thread)")
      ->check(non_negative_number());
  cmd->add_option("--batches", d->batches, "--data: timed batches (0: one epoch)")->check(non_negative_number());
  cmd->add_flag("--eval-transform", d->eval, "--data: resize + centre crop instead of RandomResizedCrop + flip");
  cmd->add_flag("--normalize", d->normalize, "--data: f32 NCHW batches (the CPU training path) instead of u8 NHWC");
  cmd->add_flag_callback(
      "--no-dct-scaling", [d] { d->dct_scaling = false; }, "--data: decode JPEGs at full size");
  cmd->add_option("--cache-mb", d->cache_mb, "--data: decoded-image cache (MiB)")->check(non_negative_number());
  cmd->add_option("--epochs", d->epochs, "--data: epochs to run; only the last is timed (fills the cache first)")
      ->check(positive_number());
  cmd->add_option("--trace", d->trace, "--data: write a Chrome trace of the loader here");
  return [cmd, a, d]() -> int {
    if (!cmd->parsed()) return -1;
    // The model's own input and classes where not given; the labels and messages use them.
    const ModelOptions o = bench_model_options(*a);
    a->input = fmt::format("{}x{}x{}", o.in_channels, o.height, o.width);
    a->classes = o.num_classes;
    if (d->path.empty()) return run_bench(*a);
    set_host_threads(a->threads);
    d->batch = cmd->count("--batch") > 0 ? a->batch : 256;  // the model's default batch (16) is too small here
    d->height = static_cast<int>(o.height);
    d->width = static_cast<int>(o.width);
    d->warmup = a->warmup;
    d->json = a->json;
    return run_data_bench(*d);
  };
}

}  // namespace rn::cli

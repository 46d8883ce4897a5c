// The typed training configuration: one struct per YAML section, defaults that train
// resnet20 on Fashion-MNIST, loaded from a YAML file plus `--set key.sub=value` overrides.
//
// Every key is described once, in the field table in config.cpp; loading, overriding,
// range checks, to_yaml() and docs/config.md (config_reference_markdown()) all read that
// table, so they cannot drift apart. An unknown key at any depth is an error that names
// the full key and suggests the closest valid one; a value of the wrong type or out of
// range is an error naming the key, the expected type or range, and the value.
//
// The section structs double as the parameter structs of the pieces they configure
// (LrSchedule takes a ScheduleConfig, Optimizer an OptimizerConfig, LossScaler a
// LossScaleConfig), so this header has no YAML in it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "data/loader.h"           // BadFilePolicy
#include "model/memory_planner.h"  // MemoryLevel

namespace rn {

enum class DatasetKind : uint8_t { fashion_mnist, synthetic, imagefolder };
enum class OptimizerKind : uint8_t { sgd, lars };
enum class ScheduleKind : uint8_t { cosine, step, poly, constant };
enum class PrecisionLevel : uint8_t { O0, O1, O2, O3 };
enum class LossScalePolicy : uint8_t { none, static_scale, dynamic };  // YAML: none | static | dynamic
enum class DeviceChoice : uint8_t { auto_select, cpu, ref, cuda };     // YAML: auto | cpu | ref | cuda
enum class ImplementationMode : uint8_t { high_performance, high_precision };

// The names used in YAML and in logs.
std::string_view enum_name(DatasetKind v);
std::string_view enum_name(OptimizerKind v);
std::string_view enum_name(ScheduleKind v);
std::string_view enum_name(PrecisionLevel v);
std::string_view enum_name(LossScalePolicy v);
std::string_view enum_name(DeviceChoice v);
std::string_view enum_name(ImplementationMode v);
std::string_view enum_name(MemoryLevel v);
std::string_view enum_name(BadFilePolicy v);
std::string_view enum_name(Bf16ConvArithmetic v);  // YAML: auto | native | fp32

struct ModelConfig {
  std::string name = "resnet20";  // resnet18/34/50/101/152, resnet20/32/44/56/110, resnet50_gdw
  int64_t num_classes = 10;
  int64_t in_channels = 1;
  std::array<int64_t, 2> image_size = {28, 28};  // {h, w} the network sees (after cropping)
  bool zero_init_residual = false;               // last BN gamma of each residual branch starts at 0
  // Weights to start from (train/pretrained.h): a safetensors file or a PyTorch .pth; "" none.
  std::string pretrained;
  std::vector<std::string> pretrained_exclude;  // tensors (or prefixes at a dot) left as initialised
  bool operator==(const ModelConfig&) const = default;
};

struct AugmentConfig {
  int64_t random_crop_padding = 2;  // pad by this many pixels, then crop image_size at random; 0: off
  bool flip = true;                 // random horizontal flip
  // Image folders and shards (variable-size photos):
  std::vector<double> scale = {0.08, 1.0};             // RandomResizedCrop area range
  std::vector<double> ratio = {3.0 / 4.0, 4.0 / 3.0};  // RandomResizedCrop aspect range
  int64_t eval_resize = 256;                           // evaluation: shorter side, then centre crop image_size
  bool dct_scaling = true;                             // decode JPEGs at the smallest sufficient n/8 scale
  bool operator==(const AugmentConfig&) const = default;
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string root = "/usr/share/datasets/fashion-mnist";
  int64_t train_subset = 0;  // use N training samples (image folders: a fixed random N); 0: all
  int64_t val_subset = 0;    // use N validation samples (image folders: a fixed random N); 0: all
  int64_t batch_size = 128;  // per rank; the global batch is batch_size * world size
  int64_t workers = 2;       // decode/augment threads
  int64_t prefetch = 2;      // batches prepared ahead of the step
  bool drop_last = true;     // drop the last incomplete training batch
  std::string val_root;      // imagefolder: validation folder; "": root/val
  std::string val_list;      // imagefolder: "relative/path label" list under val_root instead of class folders
  // imagefolder: the class names, label = position. Empty: the training folder's class folders,
  // recorded in the run's config.yaml, so that validation folders, `resnet eval` and a resume
  // give every class folder the label it was trained with, by name.
  std::vector<std::string> classes;
  BadFilePolicy bad_files = BadFilePolicy::skip;  // corrupt images: skip (counted, logged once) or error
  int64_t cache_mb = 0;                           // decoded-image cache per loader, MiB; 0: off
  int64_t cache_short_side = 256;                 // cached images keep at most this shorter side
  AugmentConfig augment;
  std::vector<double> mean = {0.2860};  // per channel, on the [0, 1] pixel scale
  std::vector<double> std = {0.3530};   // per channel, on the [0, 1] pixel scale
  bool operator==(const DataConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::sgd;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  bool decay_bn_and_bias = false;  // also decay BN gamma/beta and biases
  double lars_eta = 0.001;         // LARS trust coefficient
  double lars_eps = 1e-9;          // LARS denominator guard
  double base_lr = 0.2;            // peak lr for a global batch of lr_scale_batch
  int64_t lr_scale_batch = 256;    // peak lr = base_lr * global_batch / lr_scale_batch; 0: no scaling
  bool operator==(const OptimizerConfig&) const = default;
};

// The peak learning rate for a global batch: base_lr * global_batch / lr_scale_batch, or
// base_lr when lr_scale_batch is 0.
double scaled_peak_lr(const OptimizerConfig& cfg, int64_t global_batch);

struct ScheduleConfig {
  ScheduleKind name = ScheduleKind::cosine;
  int64_t epochs = 5;
  double warmup_epochs = 1;                            // linear warmup length in epochs ...
  int64_t warmup_steps = 0;                            // ... or in steps; steps win if > 0
  double warmup_start_factor = 0.1;                    // warmup starts at this fraction of the peak lr
  double min_lr = 0;                                   // final lr of cosine and poly decay
  std::vector<double> step_milestones = {30, 60, 80};  // epochs at which `step` multiplies by step_gamma
  double step_gamma = 0.1;
  double poly_power = 2;
  bool operator==(const ScheduleConfig&) const = default;
};

struct LossConfig {
  double label_smoothing = 0;
  bool operator==(const LossConfig&) const = default;
};

struct LossScaleConfig {
  LossScalePolicy policy = LossScalePolicy::dynamic;
  double initial = 128;
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // steps without overflow before the scale grows
  // Skipped steps in a row past which the run stops as diverged (beyond the backoffs a dynamic
  // scale needs to fall from its highest value to its lowest); 0: never.
  int64_t max_skips_in_a_row = 50;
  bool operator==(const LossScaleConfig&) const = default;
};

struct PrecisionConfig {
  PrecisionLevel level = PrecisionLevel::O0;
  DType half_dtype = DType::bf16;  // DType::bf16 or DType::f16 (YAML: bf16 | fp16)
  LossScaleConfig loss_scale;
  bool operator==(const PrecisionConfig&) const = default;
};

struct CheckpointConfig {
  int64_t every_steps = 0;  // also checkpoint every N steps; 0: off
  bool every_epoch = true;
  int64_t keep_last = 2;  // periodic checkpoints kept; 0: keep all
  bool keep_best = true;  // keep the checkpoint with the best validation top-1 as well
  bool operator==(const CheckpointConfig&) const = default;
};

struct RunConfig {
  DeviceChoice device = DeviceChoice::auto_select;
  int64_t threads = 0;  // host threads; 0: all cores
  int64_t seed = 42;
  bool deterministic = false;  // bitwise reproducible kernels and data order, possibly slower
  // high_precision: only deterministic cuDNN algorithms, no reduced-precision cuBLAS
  // reductions, direct CPU convolutions; high_performance: the fastest measured cuDNN
  // algorithms, Winograd for the CPU's 3x3 stride-1 convolutions computed in fp32 where it
  // pays. (Where a CPU's bf16 dot products are slower than its fp32 ones, bf16 convolutions
  // that pay compute in fp32 in both modes: cpu_bf16_conv_arithmetic.)
  ImplementationMode implementation_mode = ImplementationMode::high_performance;
  // The arithmetic of bf16 convolutions on the cpu backend (core/dtype.h): auto measures
  // whether this CPU's bf16 dot products outrun its fp32 ones (logged at the first).
  Bf16ConvArithmetic cpu_bf16_conv_arithmetic = Bf16ConvArithmetic::automatic;
  // GPU sink mode: the step is captured as a CUDA graph and replayed; the host
  // synchronises (reads the loss, uploads the next rates) every sink_size steps. 0: eager.
  int64_t sink_size = 0;
  std::string out_dir = "runs/default";
  int64_t log_interval_steps = 50;
  int64_t eval_interval_epochs = 1;  // 0: evaluate only after the last epoch
  bool trace = false;                // write trace.json (Chrome/Perfetto) of loader and step spans
  CheckpointConfig checkpoint;
  bool operator==(const RunConfig&) const = default;
};

struct MemoryConfig {
  MemoryLevel level = MemoryLevel::O1;
  // Level changes at epoch boundaries: "EPOCH:LEVEL[, EPOCH:LEVEL ...]", each applying from
  // that many completed epochs on ("60:O2": memory.level for the first 60 epochs, then O2).
  // Empty: memory.level throughout.
  std::string schedule;
  bool operator==(const MemoryConfig&) const = default;
};

// Troubleshooting tools (docs/troubleshooting.md): the gradient-distribution monitor, the
// device monitor and the throughput-variance analysis during training, and the thresholds
// at which `resnet doctor` fails.
struct DiagnosticsConfig {
  int64_t grad_monitor_interval = 100;   // steps between gradient statistics; 0: off
  bool device_monitor = true;            // sample power/clocks/utilisation (GPU) or cores/frequency/RSS (CPU)
  double device_monitor_interval = 1.0;  // seconds between device samples
  double variance_threshold = 0.10;      // robust CV of step time that triggers a variance warning
  int64_t variance_window = 50;          // steps in the rolling window
  double doctor_max_grad_diff = 0.5;  // relative difference of the whole gradient (mixed vs fp32) at which doctor fails
  double doctor_max_tensor_grad_diff = 1.0;  // ... of one tensor's gradient
  double doctor_max_diff_ratio = 2.0;        // ... and more than this times the rounding baseline
  double doctor_max_underflow = 0.01;        // fraction of a tensor's gradient values that underflow
  double doctor_max_overflow = 0;            // fraction of a tensor's gradient values that overflow
  bool operator==(const DiagnosticsConfig&) const = default;
};

struct MemorySwitch {
  int64_t epoch = 0;  // completed epochs before the switch (>= 1)
  MemoryLevel level = MemoryLevel::O1;
  bool operator==(const MemorySwitch&) const = default;
};
// Parses memory.schedule; throws rn::Error naming the key, the bad entry and the expected
// form. Epochs must be increasing.
std::vector<MemorySwitch> parse_memory_schedule(const std::string& text);
// The level for 0-based epoch `epoch` (the number of epochs completed before it).
MemoryLevel memory_level_at_epoch(const MemoryConfig& memory, int64_t epoch);

// Data-parallel training (docs/distributed.md). Only used when an MPI launcher starts
// more than one rank.
struct DistConfig {
  int64_t fusion_threshold = 4 << 20;       // bytes per gradient bucket
  std::vector<int64_t> bucket_boundaries;   // explicit bucket starts (parameter indices)
  bool sync_bn = false;
  double timeout_s = 300;
  std::string rank_table;
  bool operator==(const DistConfig&) const = default;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  LossConfig loss;
  PrecisionConfig precision;
  RunConfig run;
  MemoryConfig memory;
  DiagnosticsConfig diagnostics;
  DistConfig dist;

  // Throws rn::Error naming the first key that is out of range or inconsistent with another.
  void validate() const;
  // The resolved configuration as YAML, every key written; load_config() reads it back to
  // an equal Config.
  std::string to_yaml() const;
  bool operator==(const Config&) const = default;
};

// Defaults, then the YAML file at `path` (skipped when empty), then each override
// "key.sub=value" in order (the value is parsed as YAML: 0.1, true, [32, 32], text);
// then validate(). Errors name the file and line or the override.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text; `source` names it in errors.
Config load_config_from_string(const std::string& yaml, const std::vector<std::string>& overrides = {},
                               const std::string& source = "<string>");
// Applies one "key.sub=value" override (no validate()).
void apply_config_override(Config& cfg, const std::string& assignment);

// The keys whose values differ between `a` and `b`, as "key: A -> B" (values as YAML), in
// table order.
std::vector<std::string> config_differences(const Config& a, const Config& b);

// The documented keys, in table order.
struct ConfigKeyInfo {
  std::string key;            // "optimizer.momentum"
  std::string type;           // "float", "int", "bool", "string", "sgd | lars", "list of float", ...
  std::string default_value;  // as YAML
  std::string range;          // "0 <= value < 1", or empty
  std::string doc;
};
std::vector<ConfigKeyInfo> config_keys();
// docs/config.md, generated from the field table (a test keeps the file in sync).
std::string config_reference_markdown();

}  // namespace rn

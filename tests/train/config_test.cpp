#include "train/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "core/check.h"
#include "test_dir.h"
#include "train/checkpoint_file.h"

namespace rn {
namespace {

// The message of the rn::Error that `fn` throws.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an rn::Error";
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Config, DefaultsLoadAndValidate) {
  Config cfg = load_config("");
  EXPECT_EQ(cfg, Config{});
  EXPECT_EQ(cfg.model.name, "resnet20");
  EXPECT_EQ(cfg.data.dataset, DatasetKind::fashion_mnist);
  EXPECT_EQ(cfg.optimizer.lr_scale_batch, 256);
  EXPECT_EQ(cfg.precision.loss_scale.initial, 128);
  EXPECT_EQ(cfg.precision.loss_scale.growth_interval, 2000);
  EXPECT_EQ(cfg.precision.half_dtype, DType::bf16);
  EXPECT_EQ(cfg.memory.level, MemoryLevel::O1);
  cfg.validate();
}

TEST(Config, LoadsYamlFile) {
  TestDir dir;
  const std::string path = dir.file("rn50.yaml");
  write_file_atomic(path, std::string_view(R"(
model:
  name: resnet50
  num_classes: 1000
  in_channels: 3
  image_size: 224
data:
  dataset: imagefolder
  root: /data/imagenet
  batch_size: 256
  augment: {random_crop_padding: 0, flip: true}
  mean: [0.485, 0.456, 0.406]
  std: [0.229, 0.224, 0.225]
optimizer:
  name: lars
  nesterov: no
  base_lr: 2.5e-1
schedule:
  name: poly
  epochs: 35
  warmup_steps: 500
  step_milestones: [10, 20.5]
precision:
  level: O2
  half_dtype: fp16
  loss_scale:
    policy: static
    initial: 1024
run:
  device: cuda
  checkpoint:
    keep_last: 5
memory:
)"));
  Config cfg = load_config(path);
  EXPECT_EQ(cfg.model.name, "resnet50");
  EXPECT_EQ(cfg.model.num_classes, 1000);
  EXPECT_EQ(cfg.model.image_size, (std::array<int64_t, 2>{224, 224}));
  EXPECT_EQ(cfg.data.dataset, DatasetKind::imagefolder);
  EXPECT_EQ(cfg.data.root, "/data/imagenet");
  EXPECT_EQ(cfg.data.augment.random_crop_padding, 0);
  EXPECT_EQ(cfg.data.mean, (std::vector<double>{0.485, 0.456, 0.406}));
  EXPECT_EQ(cfg.optimizer.name, OptimizerKind::lars);
  EXPECT_FALSE(cfg.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(cfg.optimizer.base_lr, 0.25);
  EXPECT_EQ(cfg.optimizer.momentum, 0.9);  // untouched keys keep their defaults
  EXPECT_EQ(cfg.schedule.name, ScheduleKind::poly);
  EXPECT_EQ(cfg.schedule.warmup_steps, 500);
  EXPECT_EQ(cfg.schedule.step_milestones, (std::vector<double>{10, 20.5}));
  EXPECT_EQ(cfg.precision.level, PrecisionLevel::O2);
  EXPECT_EQ(cfg.precision.half_dtype, DType::f16);
  EXPECT_EQ(cfg.precision.loss_scale.policy, LossScalePolicy::static_scale);
  EXPECT_EQ(cfg.precision.loss_scale.initial, 1024);
  EXPECT_EQ(cfg.run.device, DeviceChoice::cuda);
  EXPECT_EQ(cfg.run.checkpoint.keep_last, 5);
  EXPECT_TRUE(cfg.run.checkpoint.every_epoch);
}

TEST(Config, OverridesNestedKeys) {
  Config cfg = load_config("", {"precision.loss_scale.initial=4096", "data.augment.flip=false", "optimizer.name=lars",
                                "model.image_size=[32, 24]", "run.out_dir=runs/a: b",
                                "schedule.step_milestones=[30, 60]", " optimizer.momentum = 0.875 "});
  EXPECT_EQ(cfg.precision.loss_scale.initial, 4096);
  EXPECT_FALSE(cfg.data.augment.flip);
  EXPECT_EQ(cfg.optimizer.name, OptimizerKind::lars);
  EXPECT_EQ(cfg.model.image_size, (std::array<int64_t, 2>{32, 24}));
  EXPECT_EQ(cfg.run.out_dir, "runs/a: b");  // strings are taken verbatim
  EXPECT_EQ(cfg.schedule.step_milestones, (std::vector<double>{30, 60}));
  EXPECT_EQ(cfg.optimizer.momentum, 0.875);
}

TEST(Config, OverridesApplyAfterFile) {
  Config cfg = load_config_from_string("optimizer: {momentum: 0.5}\n", {"optimizer.momentum=0.7"});
  EXPECT_EQ(cfg.optimizer.momentum, 0.7);
}

TEST(Config, UnknownKeySuggestsClosest) {
  std::string e = error_of([] { load_config_from_string("optimizer:\n  momentun: 0.8\n", {}, "my.yaml"); });
  EXPECT_TRUE(contains(e, "my.yaml:2: unknown key 'optimizer.momentun'; did you mean 'optimizer.momentum'?")) << e;

  e = error_of([] { load_config("", {"optimizer.momentun=0.8"}); });
  EXPECT_TRUE(contains(e, "unknown key 'optimizer.momentun'; did you mean 'optimizer.momentum'?")) << e;
  EXPECT_TRUE(contains(e, "--set optimizer.momentun=0.8")) << e;

  e = error_of([] { load_config("", {"run.epochs=3"}); });  // the key lives in another section
  EXPECT_TRUE(contains(e, "did you mean 'schedule.epochs'?")) << e;

  e = error_of([] { load_config_from_string("optimiser:\n  momentum: 0.8\n"); });
  EXPECT_TRUE(contains(e, "unknown key 'optimiser'; did you mean 'optimizer'?")) << e;

  e = error_of([] { load_config_from_string("precision:\n  loss_scale:\n    inital: 64\n"); });
  EXPECT_TRUE(contains(e, "did you mean 'precision.loss_scale.initial'?")) << e;

  // A word of a key's name, not a near spelling of another key: "batch" is data.batch_size, not
  // data.std; a section holding the key ("optimizer") is no suggestion.
  e = error_of([] { load_config("", {"data.batch=8"}); });
  EXPECT_TRUE(contains(e, "did you mean 'data.batch_size'?")) << e;
  e = error_of([] { load_config("", {"optimizer.lr=0.1"}); });
  EXPECT_TRUE(contains(e, "did you mean 'optimizer.base_lr' or 'optimizer.lr_scale_batch'?")) << e;
  e = error_of([] { load_config("", {"optimizer.learning_rate=0.1"}); });
  EXPECT_TRUE(contains(e, "did you mean 'optimizer.base_lr' or")) << e;
  e = error_of([] { load_config("", {"precision.dtype=bf16"}); });
  EXPECT_TRUE(contains(e, "did you mean 'precision.half_dtype'?")) << e;
  e = error_of([] { load_config("", {"schedule.warmup=1"}); });
  EXPECT_TRUE(contains(e,
                       "did you mean 'schedule.warmup_epochs', 'schedule.warmup_steps' or "
                       "'schedule.warmup_start_factor'?"))
      << e;

  e = error_of([] { load_config("", {"data.augment.zzzzzzzzzzzzzzzzzz=1"}); });  // nothing close: list the section
  EXPECT_TRUE(contains(e, "valid keys here: data.augment.random_crop_padding, data.augment.flip")) << e;

  e = error_of([] { load_config("", {"optimizer=sgd"}); });
  EXPECT_TRUE(contains(e, "'optimizer' is a section")) << e;
}

TEST(Config, WrongTypeNamesKeyTypeAndValue) {
  std::string e = error_of([] { load_config_from_string("optimizer:\n  base_lr: abc\n", {}, "x.yaml"); });
  EXPECT_TRUE(contains(e, "x.yaml:2: key 'optimizer.base_lr' expects a float, got 'abc'")) << e;

  e = error_of([] { load_config("", {"data.batch_size=12.5"}); });
  EXPECT_TRUE(contains(e, "key 'data.batch_size' expects an int, got '12.5'")) << e;

  e = error_of([] { load_config("", {"optimizer.name=adam"}); });
  EXPECT_TRUE(contains(e, "key 'optimizer.name' expects one of sgd | lars, got 'adam'")) << e;

  e = error_of([] { load_config("", {"data.flip=yes"}); });
  EXPECT_TRUE(contains(e, "did you mean 'data.augment.flip'?")) << e;

  e = error_of([] { load_config("", {"data.drop_last=maybe"}); });
  EXPECT_TRUE(contains(e, "key 'data.drop_last' expects a bool, got 'maybe'")) << e;

  e = error_of([] { load_config("", {"model.name=resnet21"}); });
  EXPECT_TRUE(contains(e, "key 'model.name' = 'resnet21' is not one of")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'resnet20'?")) << e;

  e = error_of([] { load_config("", {"run.cpu_bf16_conv_arithmetic=fast"}); });
  EXPECT_TRUE(contains(e, "key 'run.cpu_bf16_conv_arithmetic' expects one of auto | native | fp32, got 'fast'")) << e;

  e = error_of([] { load_config_from_string("optimizer: 3\n"); });
  EXPECT_TRUE(contains(e, "'optimizer' is a section")) << e;

  e = error_of([] { load_config_from_string("run:\n  seed: 1\n  seed: 2\n", {}, "twice.yaml"); });
  EXPECT_TRUE(contains(e, "twice.yaml:3: key 'run.seed' appears twice")) << e;

  e = error_of([] { load_config_from_string("model: [1, 2\n", {}, "broken.yaml"); });
  EXPECT_TRUE(contains(e, "broken.yaml")) << e;
  EXPECT_TRUE(contains(e, "YAML syntax error")) << e;
}

TEST(Config, OutOfRangeNamesKeyAndValue) {
  std::string e = error_of([] { load_config("", {"optimizer.momentum=1.5"}); });
  EXPECT_TRUE(contains(e, "key 'optimizer.momentum' = 1.5 is out of range: expected 0 <= value < 1")) << e;

  e = error_of([] { load_config_from_string("data:\n  batch_size: 0\n", {}, "b.yaml"); });
  EXPECT_TRUE(contains(e, "b.yaml:2: key 'data.batch_size' = 0 is out of range: expected value >= 1")) << e;

  e = error_of([] { load_config("", {"data.std=[-1]"}); });
  EXPECT_TRUE(contains(e, "key 'data.std' = [-1] is out of range: expected value > 0")) << e;

  e = error_of([] { load_config("", {"precision.loss_scale.backoff_factor=1"}); });
  EXPECT_TRUE(contains(e, "precision.loss_scale.backoff_factor")) << e;

  e = error_of([] { load_config("", {"model.num_classes=1"}); });  // the zoo's classifier needs two
  EXPECT_TRUE(contains(e, "key 'model.num_classes' = 1 is out of range: expected 2 <= value <= 16777216")) << e;

  // Values that would overflow the int they are passed on as, or a product of them (epochs x
  // steps per epoch), have upper bounds: they were silently changed (sink_size 2^32 + 1 ran as
  // 1) or named no key (data.workers 2^31).
  for (const char* set :
       {"run.sink_size=4294967297", "data.workers=2147483648", "diagnostics.variance_window=1000000000000",
        "schedule.epochs=2305843009213693952", "schedule.step_milestones=[1e300]", "schedule.warmup_epochs=1e300",
        "model.image_size=[4294967297,28]", "run.threads=10000000000"}) {
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    e = error_of([&] { load_config("", {set}); });
    EXPECT_TRUE(contains(e, "key '" + key + "'") && contains(e, "is out of range: expected")) << set << ": " << e;
  }
  // The loss scale and its inverse must be normal floats: 1e39 became an infinite scale (every
  // step skipped), 1e-40 an infinite inverse (NaN weights after one step).
  for (const char* set : {"precision.loss_scale.initial=1e39", "precision.loss_scale.initial=1e-40"}) {
    e = error_of([&] { load_config("", {set}); });
    EXPECT_TRUE(contains(e, "key 'precision.loss_scale.initial'") && contains(e, "is out of range: expected 1e-30"))
        << set << ": " << e;
  }
  e = error_of([] { load_config("", {"diagnostics.device_monitor_interval=1e-300"}); });
  EXPECT_TRUE(contains(e, "expected value >= 0.01")) << e;

  e = error_of([] { load_config("", {"optimizer.weight_decay=.nan"}); });
  EXPECT_TRUE(contains(e, "optimizer.weight_decay")) << e;

  // Infinity passes a range open above, but means nothing as a setting: an infinite initial
  // loss scale skipped every step of a run that then "finished".
  e = error_of([] { load_config("", {"precision.loss_scale.initial=.inf"}); });
  EXPECT_TRUE(contains(e, "key 'precision.loss_scale.initial' = inf is not a finite number")) << e;
  e = error_of([] { load_config("", {"data.mean=[-.inf]"}); });
  EXPECT_TRUE(contains(e, "is not a finite number")) << e;
}

TEST(Config, CrossFieldChecks) {
  std::string e = error_of([] { load_config("", {"data.mean=[0.5, 0.5, 0.5]"}); });
  EXPECT_TRUE(contains(e, "key 'data.mean' has 3 values but model.in_channels is 1")) << e;

  e = error_of([] { load_config("", {"schedule.epochs=2", "schedule.warmup_epochs=3"}); });
  EXPECT_TRUE(contains(e, "schedule.warmup_epochs")) << e;
  load_config("", {"schedule.epochs=2", "schedule.warmup_epochs=3", "schedule.warmup_steps=10"});

  e = error_of([] { load_config("", {"schedule.step_milestones=[60, 30]"}); });
  EXPECT_TRUE(contains(e, "must be increasing")) << e;

  // Sink mode cannot capture O2: refused at load, for memory.level and for a schedule that
  // reaches O2 within the run (not when the switch comes, epochs later).
  e = error_of([] { load_config("", {"run.sink_size=4", "memory.level=O2"}); });
  EXPECT_TRUE(contains(e, "key 'memory.level' = O2 cannot run in sink mode")) << e;
  e = error_of([] { load_config("", {"run.sink_size=4", "schedule.epochs=5", "memory.schedule=2:O2"}); });
  EXPECT_TRUE(contains(e, "switches to O2 after epoch 2, which sink mode (run.sink_size = 4) cannot capture")) << e;
  load_config("", {"run.sink_size=4", "schedule.epochs=5", "memory.schedule=5:O2"});  // after the last epoch
  load_config("", {"run.sink_size=4", "schedule.epochs=5", "memory.schedule=2:O0"});
  load_config("", {"schedule.epochs=5", "memory.schedule=2:O2"});

  e = error_of([] { load_config("", {"optimizer.nesterov=true", "optimizer.momentum=0"}); });
  EXPECT_TRUE(contains(e, "optimizer.nesterov")) << e;

  Config cfg;
  cfg.optimizer.momentum = -1;  // validate() catches values set in code too
  EXPECT_THROW(cfg.validate(), Error);
}

TEST(Config, ToYamlRoundTrips) {
  Config cfg = load_config(
      "", {"model.name=resnet50_gdw", "model.in_channels=3", "data.mean=[0.1, 0.2, 0.3]", "data.std=[0.4, 0.5, 0.6]",
           "data.dataset=synthetic", "optimizer.lars_eps=1e-9", "optimizer.weight_decay=3.0517578125e-05",
           "precision.half_dtype=fp16", "precision.loss_scale.policy=none", "run.device=auto",
           "run.out_dir=", "schedule.step_milestones=[]", "memory.level=O0", "model.image_size=[7, 9]"});
  const std::string yaml = cfg.to_yaml();
  EXPECT_TRUE(contains(yaml, "optimizer:")) << yaml;
  EXPECT_TRUE(contains(yaml, "  loss_scale:\n    policy: none")) << yaml;
  Config again = load_config_from_string(yaml, {}, "resolved");
  EXPECT_EQ(again, cfg) << yaml;
  EXPECT_EQ(load_config_from_string(Config{}.to_yaml()), Config{});
  // Strings that YAML would read as something else survive the round trip.
  for (const char* text : {"~", "null", "true", "12", "a: b", "[x]", "#c", " lead", "'q'"}) {
    Config c;
    c.run.out_dir = text;
    EXPECT_EQ(load_config_from_string(c.to_yaml()).run.out_dir, text) << c.to_yaml();
  }
}

// yaml-cpp reads any bytes but writes U+FFFD for those that are not UTF-8, so such a value
// would come back changed from the run folder's config.yaml: it is refused by key, whether
// it comes from a file, an override or code (found by fuzz/config_fuzz.cpp). So is a NUL.
TEST(Config, StringsMustBeUtf8) {
  std::string e = error_of([] { load_config_from_string("run:\n  out_dir: runs/\xff\xfex\n", {}, "u.yaml"); });
  EXPECT_TRUE(contains(e, "u.yaml:2: key 'run.out_dir' is not UTF-8 text")) << e;
  EXPECT_TRUE(contains(e, "byte 5 (0xff)")) << e;
  // Malformed sequences: a lone continuation byte, a truncated one, an overlong '/', a
  // surrogate, a code point above U+10FFFF, and 0xF5 which never starts one.
  for (const char* bad : {"a\x80", "a\xe2\x82", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80"}) {
    e = error_of([bad] { load_config("", {std::string("data.root=") + bad}); });
    EXPECT_TRUE(contains(e, "key 'data.root' is not UTF-8 text")) << e;
  }
  // A NUL would cut a path short.
  e = error_of([] { load_config_from_string("data:\n  val_root: \"ab\\0c\"\n", {}, "n.yaml"); });
  EXPECT_TRUE(contains(e, "n.yaml:2: key 'data.val_root' holds a NUL character at byte 2")) << e;
  Config cfg;
  cfg.data.val_list = "x\xe9";  // Latin-1, set in code: validate() refuses it too
  EXPECT_THROW(cfg.validate(), Error);
  // Well-formed text of every length survives the round trip, as do control characters.
  for (const char* good :
       {"caf\xc3\xa9", "\xe2\x82\xac/\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "a\x01\x1f\x7f"}) {
    Config c;
    c.data.root = good;
    EXPECT_EQ(load_config_from_string(c.to_yaml()).data.root, good) << c.to_yaml();
  }
}

TEST(Config, KeyTableIsComplete) {
  std::vector<ConfigKeyInfo> keys = config_keys();
  std::set<std::string> names;
  for (const auto& k : keys) {
    EXPECT_TRUE(names.insert(k.key).second) << "duplicate " << k.key;
    EXPECT_FALSE(k.doc.empty()) << k.key;
  }
  for (const char* k : {"model.zero_init_residual", "data.augment.random_crop_padding", "optimizer.lr_scale_batch",
                        "schedule.poly_power", "loss.label_smoothing", "precision.loss_scale.growth_interval",
                        "run.checkpoint.keep_best", "memory.level"})
    EXPECT_TRUE(names.count(k)) << k;
  EXPECT_EQ(enum_name(LossScalePolicy::static_scale), "static");
  EXPECT_EQ(enum_name(DeviceChoice::auto_select), "auto");
  EXPECT_EQ(enum_name(Bf16ConvArithmetic::automatic), "auto");
  EXPECT_EQ(load_config("", {}).run.cpu_bf16_conv_arithmetic, Bf16ConvArithmetic::automatic);
  EXPECT_EQ(load_config("", {"run.cpu_bf16_conv_arithmetic=fp32"}).run.cpu_bf16_conv_arithmetic,
            Bf16ConvArithmetic::fp32);
  EXPECT_EQ(
      load_config_from_string("run:\n  cpu_bf16_conv_arithmetic: native\n", {}, "x.yaml").run.cpu_bf16_conv_arithmetic,
      Bf16ConvArithmetic::native);
}

// docs/config.md is generated from the table; regenerate with RN_UPDATE_DOCS=1.
TEST(ConfigDocs, UpToDate) {
  const std::string path = std::string(RN_SOURCE_DIR) + "/docs/config.md";
  const std::string generated = config_reference_markdown();
  if (const char* update = std::getenv("RN_UPDATE_DOCS"); update && std::string(update) == "1") {
    write_file_atomic(path, generated);
  }
  std::string current;
  try {
    current = read_text_file(path);
  } catch (const Error&) {
  }
  EXPECT_EQ(current, generated) << path
                                << " is out of date: run RN_UPDATE_DOCS=1 test_train --gtest_filter=ConfigDocs.*";
}

}  // namespace
}  // namespace rn

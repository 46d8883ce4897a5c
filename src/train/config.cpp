#include "train/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "core/utf8.h"
#include "core/edit_distance.h"
#include "train/checkpoint_file.h"

namespace rn {
namespace {

// ---------------------------------------------------------------------------------------
// Enum names

template <class E>
struct EnumItem {
  E value;
  std::string_view name;
};

constexpr EnumItem<DatasetKind> kDatasetKinds[] = {{DatasetKind::fashion_mnist, "fashion_mnist"},
                                                   {DatasetKind::synthetic, "synthetic"},
                                                   {DatasetKind::imagefolder, "imagefolder"}};
constexpr EnumItem<OptimizerKind> kOptimizerKinds[] = {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::lars, "lars"}};
constexpr EnumItem<ScheduleKind> kScheduleKinds[] = {{ScheduleKind::cosine, "cosine"},
                                                     {ScheduleKind::step, "step"},
                                                     {ScheduleKind::poly, "poly"},
                                                     {ScheduleKind::constant, "constant"}};
constexpr EnumItem<PrecisionLevel> kPrecisionLevels[] = {
    {PrecisionLevel::O0, "O0"}, {PrecisionLevel::O1, "O1"}, {PrecisionLevel::O2, "O2"}, {PrecisionLevel::O3, "O3"}};
constexpr EnumItem<LossScalePolicy> kLossScalePolicies[] = {
    {LossScalePolicy::none, "none"}, {LossScalePolicy::static_scale, "static"}, {LossScalePolicy::dynamic, "dynamic"}};
constexpr EnumItem<DeviceChoice> kDeviceChoices[] = {{DeviceChoice::auto_select, "auto"},
                                                     {DeviceChoice::cpu, "cpu"},
                                                     {DeviceChoice::ref, "ref"},
                                                     {DeviceChoice::cuda, "cuda"}};
constexpr EnumItem<ImplementationMode> kImplementationModes[] = {
    {ImplementationMode::high_performance, "high_performance"}, {ImplementationMode::high_precision, "high_precision"}};
constexpr EnumItem<Bf16ConvArithmetic> kBf16ConvArithmetics[] = {{Bf16ConvArithmetic::automatic, "auto"},
                                                                 {Bf16ConvArithmetic::native, "native"},
                                                                 {Bf16ConvArithmetic::fp32, "fp32"}};
constexpr EnumItem<MemoryLevel> kMemoryLevels[] = {
    {MemoryLevel::O0, "O0"}, {MemoryLevel::O1, "O1"}, {MemoryLevel::O2, "O2"}};
// Only the half types are valid for precision.half_dtype.
constexpr EnumItem<BadFilePolicy> kBadFilePolicies[] = {{BadFilePolicy::skip, "skip"}, {BadFilePolicy::error, "error"}};
constexpr EnumItem<DType> kHalfTypes[] = {{DType::bf16, "bf16"}, {DType::f16, "fp16"}};

std::span<const EnumItem<DatasetKind>> enum_items(DatasetKind) { return kDatasetKinds; }
std::span<const EnumItem<OptimizerKind>> enum_items(OptimizerKind) { return kOptimizerKinds; }
std::span<const EnumItem<ScheduleKind>> enum_items(ScheduleKind) { return kScheduleKinds; }
std::span<const EnumItem<PrecisionLevel>> enum_items(PrecisionLevel) { return kPrecisionLevels; }
std::span<const EnumItem<LossScalePolicy>> enum_items(LossScalePolicy) { return kLossScalePolicies; }
std::span<const EnumItem<DeviceChoice>> enum_items(DeviceChoice) { return kDeviceChoices; }
std::span<const EnumItem<MemoryLevel>> enum_items(MemoryLevel) { return kMemoryLevels; }
std::span<const EnumItem<ImplementationMode>> enum_items(ImplementationMode) { return kImplementationModes; }
std::span<const EnumItem<DType>> enum_items(DType) { return kHalfTypes; }
std::span<const EnumItem<Bf16ConvArithmetic>> enum_items(Bf16ConvArithmetic) { return kBf16ConvArithmetics; }
std::span<const EnumItem<BadFilePolicy>> enum_items(BadFilePolicy) { return kBadFilePolicies; }

template <class E>
std::string_view name_of(E v) {
  for (const auto& item : enum_items(E{}))
    if (item.value == v) return item.name;
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// Helpers

std::string_view leaf_of(std::string_view key) {
  size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// The candidate closest to `wrong`. A candidate with the same last component counts as
// close even in another section ("run.epochs" -> "schedule.epochs").
std::string closest(const std::string& wrong, const std::vector<std::string>& candidates, size_t* distance) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = std::min(edit_distance(wrong, c), edit_distance(leaf_of(wrong), leaf_of(c)) + 2);
    if (d < best_d) best_d = d, best = c;
  }
  if (distance) *distance = best_d;
  return best;
}

std::string yaml_inline(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

std::string shown(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsScalar()) return node.Scalar();
  return yaml_inline(node);
}

std::string format_number(double v) { return fmt::format("{}", v); }

// ---------------------------------------------------------------------------------------
// Ranges of numeric values

struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;

  bool bounded() const { return std::isfinite(lo) || std::isfinite(hi); }
  bool contains(double v) const {
    // Written so that NaN is never contained.
    bool above = lo_open ? v > lo : v >= lo;
    bool below = hi_open ? v < hi : v <= hi;
    return above && below && !std::isnan(v);
  }
  std::string str() const {
    if (!bounded()) return "";
    if (!std::isfinite(hi)) return fmt::format("value {} {}", lo_open ? ">" : ">=", format_number(lo));
    if (!std::isfinite(lo)) return fmt::format("value {} {}", hi_open ? "<" : "<=", format_number(hi));
    return fmt::format("{} {} value {} {}", format_number(lo),
                       lo_open ? "<" : "<=", hi_open ? "<" : "<=", format_number(hi));
  }
};

Range at_least(double lo) { return Range{lo, std::numeric_limits<double>::infinity(), false, false}; }
Range above(double lo) { return Range{lo, std::numeric_limits<double>::infinity(), true, false}; }
Range closed(double lo, double hi) { return Range{lo, hi, false, false}; }
Range half_open(double lo, double hi) { return Range{lo, hi, false, true}; }    // [lo, hi)
Range open_closed(double lo, double hi) { return Range{lo, hi, true, false}; }  // (lo, hi]

// Upper bounds where a larger value is certainly a mistake and would otherwise overflow the
// int the value is passed on as, or a product of it (epochs x steps per epoch).
constexpr double kMaxExtent = 1 << 16;              // pixels or channels of an image
constexpr double kMaxClasses = 1 << 24;             // classifier outputs
constexpr double kMaxThreads = 4096;                // host threads, loader workers, prefetched batches
constexpr double kMaxEpochs = 1e6;                  // schedule lengths and milestones, in epochs
constexpr double kMaxSinkSize = 1e6;                // steps per host synchronisation
constexpr double kMaxVarianceWindow = 1e6;          // steps
constexpr double kMinDeviceMonitorInterval = 0.01;  // s: 100 samples a second at most
// The loss scale and its inverse must both be normal floats (3.4e38 > x > 1.2e-38).
constexpr double kMinLossScale = 1e-30;
constexpr double kMaxLossScale = 1e30;

// ---------------------------------------------------------------------------------------
// Codecs: YAML <-> typed value, one per value type. decode() returns false on a type
// mismatch; the caller reports it with the key and the value.

template <class T>
struct Codec;

template <>
struct Codec<bool> {
  static std::string type() { return "bool"; }
  static bool decode(const YAML::Node& n, bool& out) { return n.IsScalar() && YAML::convert<bool>::decode(n, out); }
  static YAML::Node encode(bool v) { return YAML::Node(v ? "true" : "false"); }
};

template <>
struct Codec<int64_t> {
  static std::string type() { return "int"; }
  static bool decode(const YAML::Node& n, int64_t& out) {
    return n.IsScalar() && YAML::convert<int64_t>::decode(n, out);
  }
  static YAML::Node encode(int64_t v) { return YAML::Node(std::to_string(v)); }
};

template <>
struct Codec<double> {
  static std::string type() { return "float"; }
  static bool decode(const YAML::Node& n, double& out) { return n.IsScalar() && YAML::convert<double>::decode(n, out); }
  static YAML::Node encode(double v) { return YAML::Node(format_number(v)); }
};

template <>
struct Codec<std::string> {
  static std::string type() { return "string"; }
  static bool decode(const YAML::Node& n, std::string& out) {
    if (n.IsNull()) {
      out.clear();
      return true;
    }
    if (!n.IsScalar()) return false;
    out = n.Scalar();
    return true;
  }
  static YAML::Node encode(const std::string& v) { return YAML::Node(v); }
};

template <class E>
requires std::is_enum_v<E>
struct Codec<E> {
  static std::string type() {
    std::string t;
    for (const auto& item : enum_items(E{})) t += (t.empty() ? "" : " | ") + std::string(item.name);
    return t;
  }
  static bool decode(const YAML::Node& n, E& out) {
    if (!n.IsScalar()) return false;
    for (const auto& item : enum_items(E{}))
      if (n.Scalar() == item.name) {
        out = item.value;
        return true;
      }
    return false;
  }
  static YAML::Node encode(E v) { return YAML::Node(std::string(name_of(v))); }
};

// A list of floats or ints; a single scalar is read as a one-element list.
template <class T>
requires std::is_arithmetic_v<T>
struct Codec<std::vector<T>> {
  static std::string type() { return "list of " + Codec<T>::type(); }
  static bool decode(const YAML::Node& n, std::vector<T>& out) {
    std::vector<T> v;
    if (n.IsScalar()) {
      T x;
      if (!Codec<T>::decode(n, x)) return false;
      v.push_back(x);
    } else if (n.IsSequence()) {
      for (const YAML::Node& item : n) {
        T x;
        if (!Codec<T>::decode(item, x)) return false;
        v.push_back(x);
      }
    } else {
      return false;
    }
    out = std::move(v);
    return true;
  }
  static YAML::Node encode(const std::vector<T>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (T x : v) n.push_back(Codec<T>::encode(x));
    n.SetStyle(YAML::EmitterStyle::Flow);
    return n;
  }
};

// A list of strings; a single string is read as a one-element list.
template <>
struct Codec<std::vector<std::string>> {
  static std::string type() { return "list of string"; }
  static bool decode(const YAML::Node& n, std::vector<std::string>& out) {
    std::vector<std::string> v;
    if (n.IsNull()) {
      out.clear();
      return true;
    }
    if (n.IsScalar()) {
      v.push_back(n.Scalar());
    } else if (n.IsSequence()) {
      for (const YAML::Node& item : n) {
        if (!item.IsScalar()) return false;
        v.push_back(item.Scalar());
      }
    } else {
      return false;
    }
    out = std::move(v);
    return true;
  }
  static YAML::Node encode(const std::vector<std::string>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const std::string& x : v) n.push_back(YAML::Node(x));
    n.SetStyle(YAML::EmitterStyle::Flow);
    return n;
  }
};

// {h, w}; a single int means a square.
template <>
struct Codec<std::array<int64_t, 2>> {
  static std::string type() { return "[int, int] or int"; }
  static bool decode(const YAML::Node& n, std::array<int64_t, 2>& out) {
    int64_t a, b;
    if (n.IsScalar()) {
      if (!Codec<int64_t>::decode(n, a)) return false;
      out = {a, a};
      return true;
    }
    if (!n.IsSequence() || n.size() != 2) return false;
    if (!Codec<int64_t>::decode(n[0], a) || !Codec<int64_t>::decode(n[1], b)) return false;
    out = {a, b};
    return true;
  }
  static YAML::Node encode(const std::array<int64_t, 2>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    n.push_back(Codec<int64_t>::encode(v[0]));
    n.push_back(Codec<int64_t>::encode(v[1]));
    n.SetStyle(YAML::EmitterStyle::Flow);
    return n;
  }
};

// The numbers inside a value, for range checks.
std::vector<double> numbers_in(bool) { return {}; }
std::vector<double> numbers_in(int64_t v) { return {static_cast<double>(v)}; }
std::vector<double> numbers_in(double v) { return {v}; }
std::vector<double> numbers_in(const std::string&) { return {}; }
std::vector<double> numbers_in(const std::vector<std::string>&) { return {}; }
template <class E>
requires std::is_enum_v<E> std::vector<double> numbers_in(E) { return {}; }
std::vector<double> numbers_in(const std::vector<double>& v) { return v; }
std::vector<double> numbers_in(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }
std::vector<double> numbers_in(const std::array<int64_t, 2>& v) {
  return {static_cast<double>(v[0]), static_cast<double>(v[1])};
}

// ---------------------------------------------------------------------------------------
// The field table

struct Field {
  std::string key;
  std::string type;
  std::string doc;
  Range range;
  std::vector<std::string> choices;  // for strings with a fixed set of values
  bool is_string = false;            // overrides pass the text verbatim
  std::function<void(Config&, const YAML::Node&, const std::string& where)> set;
  std::function<YAML::Node(const Config&)> get;
  std::function<void(const Config&, const std::string& where)> check;
};

// The string keys are paths, names and a switch schedule: UTF-8 text without NUL ("\0" in
// YAML), which would silently cut them short where they reach the C library.
void check_text(const Field& f, const std::string& value, const std::string& where) {
  if (const size_t at = invalid_utf8_at(value); at != std::string_view::npos) {
    RN_FAIL() << where << "key '" << f.key << "' is not UTF-8 text: no well-formed character starts at byte " << at
              << fmt::format(" (0x{:02x})", static_cast<unsigned char>(value[at]))
              << "; a YAML config holds UTF-8 only";
  }
  if (const size_t at = value.find('\0'); at != std::string::npos) {
    RN_FAIL() << where << "key '" << f.key << "' holds a NUL character at byte " << at
              << "; a path or a name cannot contain one";
  }
}

template <class T>
void check_value(const Field& f, const T& value, const std::string& where) {
  // No setting means anything at infinity or NaN (an infinite initial loss scale would skip
  // every step).
  for (double x : numbers_in(value)) {
    RN_CHECK(std::isfinite(x)) << where << "key '" << f.key << "' = " << shown(Codec<T>::encode(value))
                               << " is not a finite number";
  }
  if (f.range.bounded()) {
    for (double x : numbers_in(value)) {
      RN_CHECK(f.range.contains(x)) << where << "key '" << f.key << "' = " << shown(Codec<T>::encode(value))
                                    << " is out of range: expected " << f.range.str();
    }
  }
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    for (const std::string& v : value) check_text(f, v, where);
  }
  if constexpr (std::is_same_v<T, std::string>) {
    check_text(f, value, where);
    if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), value) == f.choices.end()) {
      std::string list;
      for (const auto& c : f.choices) list += (list.empty() ? "" : ", ") + c;
      RN_FAIL() << where << "key '" << f.key << "' = '" << value << "' is not one of " << list << "; did you mean '"
                << closest(value, f.choices, nullptr) << "'?";
    }
  }
}

// "a float", "an int", "one of sgd | lars".
std::string article(const Field& f, bool is_enum) {
  if (is_enum || !f.choices.empty()) return "one of ";
  return std::string_view("aeiou").find(f.type[0]) != std::string_view::npos ? "an " : "a ";
}

template <class Access>
Field make_field(std::string key, Access access, std::string doc, Range range = {},
                 std::vector<std::string> choices = {}) {
  using T = std::remove_cvref_t<decltype(access(std::declval<Config&>()))>;
  Field f;
  f.key = std::move(key);
  f.type = Codec<T>::type();
  f.doc = std::move(doc);
  f.range = range;
  f.choices = std::move(choices);
  f.is_string = std::is_same_v<T, std::string>;
  if (!f.choices.empty()) {
    f.type.clear();
    for (const auto& c : f.choices) f.type += (f.type.empty() ? "" : " | ") + c;
  }
  // The lambdas copy what they need rather than pointing into a Field that may move.
  Field meta = f;
  f.set = [access, meta](Config& c, const YAML::Node& n, const std::string& where) {
    T value{};
    RN_CHECK(Codec<T>::decode(n, value)) << where << "key '" << meta.key << "' expects "
                                         << article(meta, std::is_enum_v<T>) << meta.type << ", got '" << shown(n)
                                         << "'";
    check_value(meta, value, where);
    access(c) = std::move(value);
  };
  f.get = [access](const Config& c) { return Codec<T>::encode(access(c)); };
  f.check = [access, meta](const Config& c, const std::string& where) { check_value(meta, access(c), where); };
  return f;
}

// The key is the member path, so a key and its member cannot disagree.
// clang-format off
#define RN_CONFIG_FIELD(path, ...) make_field(#path, [](auto& c) -> auto& { return c.path; }, __VA_ARGS__)
// clang-format on

std::vector<Field> build_fields() {
  const std::vector<std::string> models = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152",   "resnet20",
                                           "resnet32", "resnet44", "resnet56", "resnet110", "resnet50_gdw"};
  std::vector<Field> f;
  // model
  f.push_back(RN_CONFIG_FIELD(model.name,
                              "network from the zoo; resnet20..110 are the CIFAR-style ResNets for "
                              "small images, resnet50_gdw the hardware-adapted ResNet-50",
                              {}, models));
  f.push_back(RN_CONFIG_FIELD(model.num_classes, "outputs of the classifier", closed(2, kMaxClasses)));
  f.push_back(RN_CONFIG_FIELD(model.in_channels, "input image channels (1 for Fashion-MNIST, 3 for RGB)",
                              closed(1, kMaxExtent)));
  f.push_back(RN_CONFIG_FIELD(model.image_size, "[h, w] of the images the network sees, after cropping",
                              closed(1, kMaxExtent)));
  f.push_back(RN_CONFIG_FIELD(model.zero_init_residual, "start the last BN gamma of every residual branch at 0"));
  f.push_back(RN_CONFIG_FIELD(model.pretrained,
                              "start from these weights instead of a random initialisation: a resnet.cpp checkpoint "
                              "or weights file, a safetensors file with torchvision's names, or a PyTorch .pth "
                              "(torch.save, read without Python); every tensor must fit; not read on resume"));
  f.push_back(RN_CONFIG_FIELD(model.pretrained_exclude,
                              "tensors of the model (names, or prefixes at a dot: fc, layer4) that keep their random "
                              "initialisation instead, such as a classifier for another number of classes"));
  // data
  f.push_back(RN_CONFIG_FIELD(data.dataset, "dataset format"));
  f.push_back(RN_CONFIG_FIELD(data.root, "dataset folder"));
  f.push_back(RN_CONFIG_FIELD(data.train_subset,
                              "use only N training samples (image folders: N drawn at random with run.seed, not "
                              "the first N of a folder listed class by class; a small N may miss classes; IDX "
                              "files: the first N); 0: all",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(data.val_subset,
                              "use only N validation samples (image folders: N drawn at random, seeded from "
                              "run.seed; IDX files: the first N); 0: all",
                              at_least(0)));
  f.push_back(
      RN_CONFIG_FIELD(data.batch_size, "batch per rank; the global batch is batch_size x world size", at_least(1)));
  f.push_back(RN_CONFIG_FIELD(data.workers, "threads decoding and augmenting samples", closed(0, kMaxThreads)));
  f.push_back(RN_CONFIG_FIELD(data.prefetch, "batches prepared ahead of the training step", closed(0, kMaxThreads)));
  f.push_back(RN_CONFIG_FIELD(data.drop_last,
                              "drop the last incomplete training batch of an epoch; false needs a batch size that "
                              "divides each rank's samples"));
  f.push_back(RN_CONFIG_FIELD(data.val_root, "imagefolder: validation images; empty: <root>/val"));
  f.push_back(RN_CONFIG_FIELD(data.val_list,
                              "imagefolder: a list file of 'relative/path label' lines under val_root, for "
                              "validation sets kept flat; empty: class folders"));
  f.push_back(RN_CONFIG_FIELD(data.classes,
                              "imagefolder: the class names, label = position; empty: the training folder's class "
                              "folders, recorded in the run's config.yaml so that validation folders, resnet eval "
                              "and a resume label each class folder by name (a list file's labels are positions)"));
  f.push_back(RN_CONFIG_FIELD(data.bad_files,
                              "a corrupt, truncated or non-image file: skip it (replaced by the next readable "
                              "image, counted, logged once) or stop with an error naming it"));
  f.push_back(RN_CONFIG_FIELD(data.cache_mb,
                              "imagefolder: keep decoded, downscaled training images in memory up to this many MiB, "
                              "so later epochs skip reading and decoding (validation reads past it); 0: off",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(data.cache_short_side, "imagefolder: cached images keep at most this shorter side",
                              closed(1, kMaxExtent)));
  f.push_back(RN_CONFIG_FIELD(data.augment.random_crop_padding,
                              "pad by this many pixels then crop image_size at a random place; 0: no crop",
                              closed(0, kMaxExtent)));
  f.push_back(RN_CONFIG_FIELD(data.augment.flip, "random horizontal flip"));
  f.push_back(RN_CONFIG_FIELD(data.augment.scale,
                              "imagefolder: RandomResizedCrop area range [min, max], fractions of the image"));
  f.push_back(RN_CONFIG_FIELD(data.augment.ratio, "imagefolder: RandomResizedCrop aspect-ratio range [min, max]"));
  f.push_back(RN_CONFIG_FIELD(data.augment.eval_resize,
                              "imagefolder: evaluation resizes the shorter side to this, then takes the centre "
                              "model.image_size",
                              closed(1, kMaxExtent)));
  f.push_back(RN_CONFIG_FIELD(data.augment.dct_scaling,
                              "imagefolder: decode JPEGs at the smallest n/8 scale that still covers the crop "
                              "(much faster; false decodes at full size, bit-exact with PIL)"));
  f.push_back(RN_CONFIG_FIELD(data.mean, "per-channel mean subtracted, on the [0, 1] pixel scale"));
  f.push_back(
      RN_CONFIG_FIELD(data.std, "per-channel standard deviation divided by, on the [0, 1] pixel scale", above(0)));
  // optimizer
  f.push_back(RN_CONFIG_FIELD(optimizer.name,
                              "sgd: momentum SGD (PyTorch semantics); lars: layer-wise adaptive "
                              "rate scaling (MLPerf form)"));
  f.push_back(RN_CONFIG_FIELD(optimizer.momentum, "momentum coefficient", half_open(0, 1)));
  f.push_back(RN_CONFIG_FIELD(optimizer.nesterov, "Nesterov momentum"));
  f.push_back(RN_CONFIG_FIELD(optimizer.weight_decay, "L2 weight decay added to the gradient", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(optimizer.decay_bn_and_bias, "apply weight decay to BN gamma/beta and biases too"));
  f.push_back(RN_CONFIG_FIELD(optimizer.lars_eta, "LARS trust coefficient", above(0)));
  f.push_back(RN_CONFIG_FIELD(optimizer.lars_eps, "LARS guard added to the trust-ratio denominator", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(optimizer.base_lr, "peak learning rate for a global batch of lr_scale_batch", above(0)));
  f.push_back(RN_CONFIG_FIELD(optimizer.lr_scale_batch,
                              "peak lr = base_lr x global_batch / lr_scale_batch; 0: peak lr = base_lr", at_least(0)));
  // schedule
  f.push_back(RN_CONFIG_FIELD(schedule.name,
                              "decay after warmup: cosine to min_lr, step (x step_gamma at each "
                              "milestone), poly ((1 - t)^poly_power to min_lr), constant"));
  f.push_back(RN_CONFIG_FIELD(schedule.epochs, "training length in epochs", closed(1, kMaxEpochs)));
  f.push_back(RN_CONFIG_FIELD(schedule.warmup_epochs, "linear warmup length in epochs (may be fractional)",
                              closed(0, kMaxEpochs)));
  f.push_back(RN_CONFIG_FIELD(schedule.warmup_steps, "linear warmup length in steps; wins over warmup_epochs if > 0",
                              at_least(0)));
  f.push_back(
      RN_CONFIG_FIELD(schedule.warmup_start_factor, "warmup starts at this fraction of the peak lr", closed(0, 1)));
  f.push_back(RN_CONFIG_FIELD(schedule.min_lr, "final learning rate of cosine and poly decay", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(schedule.step_milestones,
                              "epochs at which the step schedule multiplies the lr by "
                              "step_gamma (increasing)",
                              open_closed(0, kMaxEpochs)));
  f.push_back(RN_CONFIG_FIELD(schedule.step_gamma, "factor applied at each milestone", open_closed(0, 1)));
  f.push_back(RN_CONFIG_FIELD(schedule.poly_power, "exponent of the poly decay", above(0)));
  // loss
  f.push_back(RN_CONFIG_FIELD(loss.label_smoothing, "label smoothing of the training cross-entropy target (evaluation losses are plain cross-entropy, as top-1 and top-5 are of the plain prediction)", half_open(0, 1)));
  {
    // The loss computes in float: a value just below 1 passes [0, 1) here and becomes 1.0f, which
    // the loss would refuse quoting a 1 the user never gave.
    const auto below_one_as_float = [](const Config& c, const std::string& where) {
      RN_CHECK(static_cast<float>(c.loss.label_smoothing) < 1.0f)
          << where << "key 'loss.label_smoothing' = " << format_number(c.loss.label_smoothing)
          << " rounds to 1 as a float, and the loss computes in float: expected a value of at most "
          << format_number(std::nextafter(1.0f, 0.0f));
    };
    Field& ls = f.back();
    ls.set = [set = ls.set, below_one_as_float](Config& c, const YAML::Node& n, const std::string& where) {
      set(c, n, where);
      below_one_as_float(c, where);
    };
    ls.check = [check = ls.check, below_one_as_float](const Config& c, const std::string& where) {
      check(c, where);
      below_one_as_float(c, where);
    };
  }
  // precision
  f.push_back(RN_CONFIG_FIELD(precision.level,
                              "O0 fp32; O1 half convs/matmuls, the rest fp32; O2 half model with "
                              "fp32 BN and master weights; O3 pure half"));
  f.push_back(RN_CONFIG_FIELD(precision.half_dtype, "the half type of O1-O3"));
  f.push_back(RN_CONFIG_FIELD(precision.loss_scale.policy,
                              "dynamic: back off on overflow, grow after growth_interval clean steps; static: fixed "
                              "at initial; none: scale 1. Overflowing steps are skipped under every policy"));
  f.push_back(RN_CONFIG_FIELD(precision.loss_scale.initial, "initial (or static) loss scale",
                              closed(kMinLossScale, kMaxLossScale)));
  f.push_back(
      RN_CONFIG_FIELD(precision.loss_scale.growth_factor, "multiplier after growth_interval clean steps", at_least(1)));
  f.push_back(RN_CONFIG_FIELD(precision.loss_scale.backoff_factor, "multiplier on overflow", Range{0, 1, true, true}));
  f.push_back(RN_CONFIG_FIELD(precision.loss_scale.growth_interval, "clean steps before the scale grows", at_least(1)));
  f.push_back(RN_CONFIG_FIELD(precision.loss_scale.max_skips_in_a_row,
                              "overflowing (skipped) steps in a row after which training stops as diverged, counted "
                              "past the backoffs a dynamic scale needs to fall from its highest value to its lowest "
                              "(24 at the defaults): the weights no longer change, so more steps cannot recover; 0: "
                              "never stop. Sink mode reads the device's count at log lines, so it stops at the "
                              "next one",
                              at_least(0)));
  // run
  f.push_back(RN_CONFIG_FIELD(run.device,
                              "where to train; auto: CUDA if present, else cpu (oneDNN); ref: the "
                              "naive reference backend"));
  f.push_back(RN_CONFIG_FIELD(run.threads, "host threads; 0: all cores", closed(0, kMaxThreads)));
  f.push_back(RN_CONFIG_FIELD(run.trace,
                              "write trace.json in the run folder: loader batches and training steps as spans "
                              "that chrome://tracing and Perfetto open"));
  f.push_back(RN_CONFIG_FIELD(run.seed, "seed of weights init, data order and augmentation", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(run.deterministic,
                              "kernels with a fixed summation order, so that the same machine, "
                              "build and thread count give bit-identical runs (GPU: deterministic cuDNN algorithms "
                              "only, possibly slower; the CPU's kernels have a fixed order already)"));
  f.push_back(
      RN_CONFIG_FIELD(run.implementation_mode,
                      "kernels: high_performance takes the fastest (GPU: the fastest measured cuDNN "
                      "algorithms; CPU: Winograd for the 3x3 stride-1 convolutions computed in fp32 where it pays: "
                      "channels in 16s, at least 64, 50M+ multiply-adds, an AVX-512 CPU); high_precision only "
                      "deterministic cuDNN algorithms, no reduced-precision "
                      "cuBLAS reductions and direct CPU convolutions (BN and the loss accumulate in fp32 in "
                      "both; run.cpu_bf16_conv_arithmetic applies in both). Logged at start"));
  f.push_back(RN_CONFIG_FIELD(
      run.cpu_bf16_conv_arithmetic,
      "the cpu backend's bf16 convolutions: native (oneDNN's bf16 kernels), fp32 (the same bf16 values "
      "computed by its fp32 kernels, Winograd included, the result rounded to bf16) or auto: native on AMX "
      "CPUs; elsewhere oneDNN's bf16 and fp32 GEMMs are timed once (logged) and where bf16 is slower, "
      "convolutions with 96+ multiply-adds per activation element compute in fp32. Only the summation "
      "order differs; the tensors stay bf16"));
  f.push_back(RN_CONFIG_FIELD(run.sink_size,
                              "GPU sink mode: capture the training step as a CUDA graph and replay it, "
                              "synchronising with the host (loss read-back, next learning rates) every sink_size "
                              "steps; every step's loss is recorded on the device and read at those "
                              "synchronisations and at log lines; 0: eager steps",
                              closed(0, kMaxSinkSize)));
  f.push_back(RN_CONFIG_FIELD(run.out_dir, "run folder: train.log, metrics.jsonl, config.yaml, checkpoints"));
  f.push_back(
      RN_CONFIG_FIELD(run.log_interval_steps,
                      "steps between progress lines and train records (also written at each epoch's last step, a step "
                      "limit and a stop request)",
                      at_least(1)));
  f.push_back(
      RN_CONFIG_FIELD(run.eval_interval_epochs, "epochs between evaluations; 0: only after the last", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(run.checkpoint.every_steps,
                              "also checkpoint every N steps (one due at an epoch's last step is written after that "
                              "epoch's evaluation, with its top-1, so that it may become best.safetensors); 0: off",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(run.checkpoint.every_epoch, "checkpoint at the end of every epoch"));
  f.push_back(RN_CONFIG_FIELD(run.checkpoint.keep_last, "periodic checkpoints kept; 0: all", at_least(0)));
  f.push_back(RN_CONFIG_FIELD(run.checkpoint.keep_best, "also keep the checkpoint with the best validation top-1"));
  // memory
  f.push_back(RN_CONFIG_FIELD(memory.level,
                              "O0 no buffer reuse (debugging); O1 reuse by liveness; O2 also recompute BN and ReLU "
                              "outputs in backward (about half of O1's activation memory, same results)"));
  f.push_back(RN_CONFIG_FIELD(memory.schedule,
                              "switch levels at epoch boundaries: 'EPOCH:LEVEL, ...', each from that many completed "
                              "epochs on ('60:O2': memory.level for 60 epochs, then O2); empty: no switch"));
  // dist
  f.push_back(RN_CONFIG_FIELD(dist.fusion_threshold,
                              "data-parallel: gradient bucket size in bytes; each bucket's all-reduce starts as soon "
                              "as backward has written it",
                              at_least(1)));
  f.push_back(RN_CONFIG_FIELD(dist.bucket_boundaries,
                              "data-parallel: explicit bucket starts by parameter index (gradient-production order, "
                              "as `resnet info --params` lists them) instead of fusion_threshold; empty: use the "
                              "threshold",
                              at_least(1)));
  f.push_back(RN_CONFIG_FIELD(dist.sync_bn,
                              "data-parallel: batch-norm statistics over the global batch (one all-reduce per BN "
                              "layer in forward and in backward) instead of per rank"));
  f.push_back(RN_CONFIG_FIELD(dist.timeout_s,
                              "data-parallel: a collective that waits this long, or a rank silent this long, ends "
                              "the job with a message naming the rank and what it was doing (at least 1 s: "
                              "heartbeats and scheduling need a few tenths of a second)",
                              at_least(1)));
  f.push_back(RN_CONFIG_FIELD(dist.rank_table,
                              "data-parallel: JSON file mapping ranks to hosts, devices and the network interface "
                              "(docs/distributed.md); empty: the launcher's placement"));
  // diagnostics
  f.push_back(RN_CONFIG_FIELD(diagnostics.grad_monitor_interval,
                              "steps between gradient statistics (per tensor norms, update/weight ratio, log "
                              "histogram, zero/inf/NaN fractions) written to grad_summary.jsonl; 0: off",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.device_monitor,
                              "sample the device while training (GPU: power, clocks, temperature, utilisation, "
                              "memory via NVML; CPU: per-core utilisation, frequency, resident memory) into "
                              "metrics.jsonl"));
  f.push_back(RN_CONFIG_FIELD(diagnostics.device_monitor_interval, "seconds between device samples",
                              at_least(kMinDeviceMonitorInterval)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.variance_threshold,
                              "spread of step times (robust coefficient of variation over variance_window steps) "
                              "past which one warning names the likely cause",
                              above(0)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.variance_window,
                              "steps in the variance analysis' rolling window (at least 11, so that the P90 of its "
                              "step times never reaches into a lone slow step)",
                              closed(11, kMaxVarianceWindow)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.doctor_max_grad_diff,
                              "resnet doctor fails when the whole gradient (all tensors) differs from fp32 by more "
                              "than this (relative L2 norm, first step)",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.doctor_max_tensor_grad_diff,
                              "resnet doctor fails when one tensor's gradient differs from fp32 by more than this "
                              "(relative L2 norm, first step; small BN tensors near the input differ most)",
                              at_least(0)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.doctor_max_diff_ratio,
                              "resnet doctor fails on a gradient difference (whole or per tensor) only when it is "
                              "also more than this many times the rounding baseline: the difference fp32 itself "
                              "shows when only the weights and the input are rounded to the half dtype",
                              at_least(1)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.doctor_max_underflow,
                              "resnet doctor fails when more than this fraction of a tensor's gradient values "
                              "underflow to zero in the half dtype at the loss scale",
                              closed(0, 1)));
  f.push_back(RN_CONFIG_FIELD(diagnostics.doctor_max_overflow,
                              "resnet doctor fails when more than this fraction of a tensor's gradient values "
                              "overflow in the half dtype at the loss scale",
                              closed(0, 1)));
  return f;
}

#undef RN_CONFIG_FIELD

const std::vector<Field>& fields() {
  static const std::vector<Field> table = build_fields();
  return table;
}

std::vector<std::string> section_of(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(key.substr(0, dot));
  return parts;  // "a.b.c" -> {"a", "a.b"}
}

const Field* find_field(const std::string& key) {
  for (const Field& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

bool is_section(const std::string& key) {
  for (const Field& f : fields())
    if (f.key.size() > key.size() && f.key.compare(0, key.size(), key) == 0 && f.key[key.size()] == '.') return true;
  return false;
}

// Every key and section name, the candidates for a suggestion.
std::vector<std::string> all_names() {
  std::vector<std::string> names;
  for (const Field& f : fields()) {
    for (auto& s : section_of(f.key))
      if (std::find(names.begin(), names.end(), s) == names.end()) names.push_back(s);
    names.push_back(f.key);
  }
  return names;
}

// Keys whose last name holds the wrong key's last name as a word ("batch" in batch_size, "lr"
// in base_lr, "dtype" in half_dtype), in the wrong key's section when that is one.
std::vector<std::string> word_matches(const std::string& key) {
  std::string word(leaf_of(key));
  if (word == "learning_rate" || word == "lr_base") word = "lr";
  const size_t dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  const bool in_section = !section.empty() && is_section(section);
  std::vector<std::string> out;
  for (const Field& f : fields()) {
    if (in_section && f.key.rfind(section + ".", 0) != 0) continue;
    const std::string_view leaf = leaf_of(f.key);
    for (size_t at = 0; at <= leaf.size();) {
      const size_t end = std::min(leaf.find('_', at), leaf.size());
      if (leaf.substr(at, end - at) == word) {
        out.push_back(f.key);
        break;
      }
      at = end + 1;
    }
  }
  return out;
}

[[noreturn]] void fail_unknown_key(const std::string& key, const std::string& where) {
  // A section that holds the key ("optimizer" for optimizer.lr) is no suggestion.
  std::vector<std::string> names = all_names();
  std::erase_if(names, [&](const std::string& n) { return key.rfind(n + ".", 0) == 0; });
  size_t d;
  std::string suggestion = closest(key, names, &d);
  if (d <= 2) RN_FAIL() << where << "unknown key '" << key << "'; did you mean '" << suggestion << "'?";
  if (const std::vector<std::string> words = word_matches(key); !words.empty() && words.size() <= 3) {
    std::string list;
    for (size_t i = 0; i < words.size(); ++i)
      list += (i == 0 ? "'" : i + 1 == words.size() ? "' or '" : "', '") + words[i];
    RN_FAIL() << where << "unknown key '" << key << "'; did you mean " << list << "'?";
  }
  if (d <= std::max<size_t>(2, key.size() / 2))
    RN_FAIL() << where << "unknown key '" << key << "'; did you mean '" << suggestion << "'?";
  // Nothing close: list the keys of the deepest known enclosing section.
  std::string section;
  for (auto& s : section_of(key))
    if (is_section(s)) section = s;
  std::string list;
  for (const std::string& name : all_names()) {
    bool in_section =
        section.empty() ? name.find('.') == std::string::npos
                        : name.rfind(section + ".", 0) == 0 && name.find('.', section.size() + 1) == std::string::npos;
    if (in_section) list += (list.empty() ? "" : ", ") + name;
  }
  RN_FAIL() << where << "unknown key '" << key << "'; valid keys here: " << list;
}

std::string where_in(const std::string& source, const YAML::Node& node) {
  int line = node.Mark().line;
  return line >= 0 ? fmt::format("{}:{}: ", source, line + 1) : source + ": ";
}

void apply_mapping(Config& cfg, const YAML::Node& map, const std::string& prefix, const std::string& source) {
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string where = where_in(source, it->first);
    RN_CHECK(it->first.IsScalar()) << where << "keys must be plain names, got " << shown(it->first);
    std::string key = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
    RN_CHECK(seen.insert(key).second) << where << "key '" << key << "' appears twice";
    if (const Field* f = find_field(key)) {
      f->set(cfg, it->second, where);
    } else if (is_section(key)) {
      if (it->second.IsNull()) continue;  // an empty section keeps its defaults
      RN_CHECK(it->second.IsMap()) << where << "'" << key << "' is a section and needs a mapping of keys, got '"
                                   << shown(it->second) << "'";
      apply_mapping(cfg, it->second, key, source);
    } else {
      fail_unknown_key(key, where);
    }
  }
}

std::string trim(std::string s) {
  auto blank = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && blank(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && blank(s[i])) ++i;
  return s.substr(i);
}

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    RN_FAIL() << source << ":" << e.mark.line + 1 << ": YAML syntax error: " << e.msg;
  }
}

void apply_document(Config& cfg, const std::string& text, const std::string& source) {
  YAML::Node root = parse_yaml(text, source);
  if (root.IsNull()) return;
  RN_CHECK(root.IsMap()) << source << ": a config is a mapping of sections (model, data, optimizer, ...), got '"
                         << shown(root) << "'";
  apply_mapping(cfg, root, "", source);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API

std::string_view enum_name(DatasetKind v) { return name_of(v); }
std::string_view enum_name(OptimizerKind v) { return name_of(v); }
std::string_view enum_name(ScheduleKind v) { return name_of(v); }
std::string_view enum_name(PrecisionLevel v) { return name_of(v); }
std::string_view enum_name(LossScalePolicy v) { return name_of(v); }
std::string_view enum_name(DeviceChoice v) { return name_of(v); }
std::string_view enum_name(ImplementationMode v) { return name_of(v); }
std::string_view enum_name(MemoryLevel v) { return name_of(v); }
std::string_view enum_name(BadFilePolicy v) { return name_of(v); }
std::string_view enum_name(Bf16ConvArithmetic v) { return name_of(v); }

double scaled_peak_lr(const OptimizerConfig& cfg, int64_t global_batch) {
  if (cfg.lr_scale_batch == 0) return cfg.base_lr;
  return cfg.base_lr * static_cast<double>(global_batch) / static_cast<double>(cfg.lr_scale_batch);
}

void Config::validate() const {
  const std::string where = "config: ";
  for (const Field& f : fields()) f.check(*this, where);
  const auto channels = static_cast<size_t>(model.in_channels);
  RN_CHECK(data.mean.size() == channels) << where << "key 'data.mean' has " << data.mean.size()
                                         << " values but model.in_channels is " << model.in_channels;
  RN_CHECK(data.std.size() == channels) << where << "key 'data.std' has " << data.std.size()
                                        << " values but model.in_channels is " << model.in_channels;
  RN_CHECK(model.pretrained_exclude.empty() || !model.pretrained.empty())
      << where << "key 'model.pretrained_exclude' names tensors to keep out of model.pretrained, which is not set";
  if (!data.classes.empty()) {
    RN_CHECK(data.dataset == DatasetKind::imagefolder)
        << where << "key 'data.classes' names the classes of an image folder, but data.dataset is "
        << name_of(data.dataset);
    RN_CHECK(static_cast<int64_t>(data.classes.size()) <= model.num_classes)
        << where << "key 'data.classes' lists " << data.classes.size() << " classes but model.num_classes is "
        << model.num_classes;
    std::vector<std::string> sorted = data.classes;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      RN_CHECK(!sorted[i].empty()) << where << "key 'data.classes' has an empty class name";
      RN_CHECK(i == 0 || sorted[i] != sorted[i - 1])
          << where << "key 'data.classes' names class '" << sorted[i] << "' twice";
    }
  }
  if (data.dataset == DatasetKind::imagefolder) {
    RN_CHECK(model.in_channels == 3) << where << "key 'model.in_channels' = " << model.in_channels
                                     << " but image folders decode to RGB (3 channels)";
    const auto& a = data.augment;
    RN_CHECK(a.scale.size() == 2 && a.scale[0] > 0 && a.scale[0] <= a.scale[1] && a.scale[1] <= 1)
        << where << "key 'data.augment.scale' must be [min, max] with 0 < min <= max <= 1, got "
        << shown(Codec<std::vector<double>>::encode(a.scale));
    RN_CHECK(a.ratio.size() == 2 && a.ratio[0] > 0 && a.ratio[0] <= a.ratio[1])
        << where << "key 'data.augment.ratio' must be [min, max] with 0 < min <= max, got "
        << shown(Codec<std::vector<double>>::encode(a.ratio));
    RN_CHECK(a.eval_resize >= model.image_size[0] && a.eval_resize >= model.image_size[1])
        << where << "key 'data.augment.eval_resize' = " << a.eval_resize << " is smaller than model.image_size";
  }
  if (data.dataset == DatasetKind::fashion_mnist) {
    RN_CHECK(model.in_channels == 1) << where << "key 'model.in_channels' = " << model.in_channels
                                     << " but Fashion-MNIST images have 1 channel";
  }
  if (schedule.warmup_steps == 0) {
    RN_CHECK(schedule.warmup_epochs <= static_cast<double>(schedule.epochs))
        << where << "key 'schedule.warmup_epochs' = " << schedule.warmup_epochs
        << " is longer than schedule.epochs = " << schedule.epochs;
  }
  for (size_t i = 1; i < schedule.step_milestones.size(); ++i) {
    RN_CHECK(schedule.step_milestones[i] > schedule.step_milestones[i - 1])
        << where << "key 'schedule.step_milestones' must be increasing, got "
        << shown(Codec<std::vector<double>>::encode(schedule.step_milestones));
  }
  RN_CHECK(!optimizer.nesterov || optimizer.momentum > 0)
      << where << "key 'optimizer.nesterov' = true needs optimizer.momentum > 0";
  const std::vector<MemorySwitch> switches = parse_memory_schedule(memory.schedule);
  // Sink mode captures the step as a CUDA graph; O2's recompute checks synchronise with the
  // host, so it cannot be captured. A schedule that reaches O2 is refused now, not at the switch.
  if (run.sink_size > 0) {
    RN_CHECK(memory.level != MemoryLevel::O2)
        << where << "key 'memory.level' = O2 cannot run in sink mode (run.sink_size = " << run.sink_size
        << "): its recompute checks synchronise with the host; use O1, or run.sink_size=0";
    for (const MemorySwitch& s : switches)
      RN_CHECK(s.level != MemoryLevel::O2 || s.epoch >= schedule.epochs)
          << where << "key 'memory.schedule' = '" << memory.schedule << "' switches to O2 after epoch " << s.epoch
          << ", which sink mode (run.sink_size = " << run.sink_size
          << ") cannot capture: its recompute checks synchronise with the host; switch to O1, or run.sink_size=0";
  }
}

std::vector<MemorySwitch> parse_memory_schedule(const std::string& text) {
  std::vector<MemorySwitch> out;
  const auto fail = [&](const std::string& entry, const std::string& why) {
    RN_FAIL() << "config: key 'memory.schedule' = '" << text << "': entry '" << entry << "' " << why
              << " (expected 'EPOCH:LEVEL, ...' with EPOCH >= 1 increasing and LEVEL one of O0, O1, O2, as in "
                 "'60:O2')";
  };
  if (text.find_first_not_of(" \t") == std::string::npos) return out;  // no schedule
  std::vector<std::string> entries(1);
  for (char ch : text) {
    if (ch == ',')
      entries.emplace_back();
    else
      entries.back() += ch;
  }
  for (std::string& entry : entries) {
    // Spaces around an entry and its ':' are fine; elsewhere they are a missing comma ('1:O2 2:O1').
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    for (size_t c = entry.find(':'); c != std::string::npos; c = entry.find(':', c + 1)) {
      while (c > 0 && (entry[c - 1] == ' ' || entry[c - 1] == '\t')) entry.erase(--c, 1);
      while (c + 1 < entry.size() && (entry[c + 1] == ' ' || entry[c + 1] == '\t')) entry.erase(c + 1, 1);
    }
    if (entry.empty()) fail(entry, "is empty");
    if (entry.find_first_of(" \t") != std::string::npos) fail(entry, "holds a space: separate entries with ','");
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) fail(entry, "has no ':'");
    MemorySwitch sw;
    const std::string epoch = entry.substr(0, colon), level = entry.substr(colon + 1);
    size_t used = 0;
    try {
      sw.epoch = std::stoll(epoch, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != epoch.size()) fail(entry, "does not start with a whole number of epochs");
    if (sw.epoch < 1) fail(entry, "switches before epoch 1 (set memory.level instead)");
    if (!out.empty() && sw.epoch <= out.back().epoch) fail(entry, "is not after the previous switch");
    bool known = false;
    for (const auto& item : kMemoryLevels)
      if (level == item.name) sw.level = item.value, known = true;
    if (!known) fail(entry, "names an unknown level '" + level + "'");
    out.push_back(sw);
  }
  return out;
}

MemoryLevel memory_level_at_epoch(const MemoryConfig& memory, int64_t epoch) {
  MemoryLevel level = memory.level;
  for (const MemorySwitch& sw : parse_memory_schedule(memory.schedule))
    if (epoch >= sw.epoch) level = sw.level;
  return level;
}

std::vector<std::string> config_differences(const Config& a, const Config& b) {
  std::vector<std::string> out;
  for (const Field& f : fields()) {
    YAML::Emitter ea, eb;
    ea << YAML::Flow << f.get(a);
    eb << YAML::Flow << f.get(b);
    if (std::string(ea.c_str()) != eb.c_str()) out.push_back(f.key + ": " + ea.c_str() + " -> " + eb.c_str());
  }
  return out;
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  // Fields of a section are contiguous in the table, so the open sections form a stack.
  std::vector<std::string> open;
  for (const Field& f : fields()) {
    std::vector<std::string> sections = section_of(f.key);
    while (!open.empty() && (open.size() > sections.size() || open.back() != sections[open.size() - 1])) {
      out << YAML::EndMap;
      open.pop_back();
    }
    while (open.size() < sections.size()) {
      const std::string& s = sections[open.size()];
      out << YAML::Key << std::string(leaf_of(s)) << YAML::Value << YAML::BeginMap;
      open.push_back(s);
    }
    out << YAML::Key << std::string(leaf_of(f.key)) << YAML::Value << f.get(*this);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  RN_CHECK(out.good()) << "to_yaml: " << out.GetLastError();
  return std::string("# resnet.cpp training configuration, every key resolved\n") + out.c_str() + "\n";
}

void apply_config_override(Config& cfg, const std::string& assignment) {
  const std::string where = "--set " + assignment + ": ";
  size_t eq = assignment.find('=');
  RN_CHECK(eq != std::string::npos) << where << "an override is key.sub=value";
  std::string key = trim(assignment.substr(0, eq));
  std::string value = trim(assignment.substr(eq + 1));
  const Field* f = find_field(key);
  if (f == nullptr) {
    if (is_section(key)) {
      std::string first;
      for (const Field& g : fields())
        if (g.key.rfind(key + ".", 0) == 0) {
          first = g.key;
          break;
        }
      RN_FAIL() << where << "'" << key << "' is a section; set one of its keys, e.g. " << first << "=...";
    }
    fail_unknown_key(key, where);
  }
  // Strings take the text as written (a path may contain ':' or start with '['); other
  // values are YAML so that lists and every number format work as in a file.
  YAML::Node node;
  if (f->is_string) {
    node = YAML::Node(value);
  } else {
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      RN_FAIL() << where << "key '" << key << "' expects " << f->type << ", got '" << value << "' (" << e.msg << ")";
    }
  }
  f->set(cfg, node, where);
}

Config load_config_from_string(const std::string& yaml, const std::vector<std::string>& overrides,
                               const std::string& source) {
  Config cfg;
  apply_document(cfg, yaml, source);
  for (const std::string& o : overrides) apply_config_override(cfg, o);
  cfg.validate();
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::string text = path.empty() ? std::string() : read_text_file(path);
  return load_config_from_string(text, overrides, path.empty() ? "<defaults>" : path);
}

std::vector<ConfigKeyInfo> config_keys() {
  const Config defaults;
  std::vector<ConfigKeyInfo> keys;
  for (const Field& f : fields()) keys.push_back({f.key, f.type, yaml_inline(f.get(defaults)), f.range.str(), f.doc});
  return keys;
}

std::string config_reference_markdown() {
  std::string md =
      "# Configuration reference\n"
      "\n"
      "<!-- Generated from the field table in src/train/config.cpp by config_reference_markdown(); "
      "do not edit by hand. Regenerate with: RN_UPDATE_DOCS=1 build/tests/test_train "
      "--gtest_filter=ConfigDocs.* -->\n"
      "\n"
      "`resnet train --config FILE.yaml --set key.sub=value ...` starts from the defaults below (resnet20 on\n"
      "Fashion-MNIST), applies the YAML file, then each `--set` in order. A `--set` value is read as YAML\n"
      "(`0.1`, `true`, `[32, 32]`), except for string keys, which take the text as written. The resolved\n"
      "configuration is written to the run folder as `config.yaml`.\n"
      "\n"
      "Every key is checked: an unknown key is an error that suggests the closest valid one, a value of the\n"
      "wrong type or out of range is an error naming the key and the value. Some keys are also checked\n"
      "against each other: `data.mean` and `data.std` need one value per `model.in_channels`,\n"
      "`schedule.warmup_epochs` may not exceed `schedule.epochs`, `schedule.step_milestones` must increase,\n"
      "and Nesterov needs a momentum above 0. String values must be UTF-8 text without NUL characters\n"
      "(a path in another encoding is refused, naming the key and the first bad byte).\n"
      "\n"
      "The peak learning rate is `optimizer.base_lr * global_batch / optimizer.lr_scale_batch`. The\n"
      "schedule ramps linearly from `warmup_start_factor * peak` to the peak over the warmup, then decays;\n"
      "it is a pure function of the step, so a resumed run continues on the same curve.\n";
  std::string section;
  for (const ConfigKeyInfo& k : config_keys()) {
    std::string top = k.key.substr(0, k.key.find('.'));
    if (top != section) {
      section = top;
      md += "\n## " + section + "\n\n| key | type | default | range | meaning |\n| --- | --- | --- | --- | --- |\n";
    }
    auto cell = [](std::string s) {
      std::string escaped;
      for (char c : s) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
      return escaped;
    };
    md += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", k.key, cell(k.type), k.default_value, cell(k.range),
                      cell(k.doc));
  }
  return md;
}

}  // namespace rn

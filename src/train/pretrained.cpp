#include "train/pretrained.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/plural.h"
#include "model/safetensors.h"
#include "model/torch_file.h"

namespace rn {
namespace {

// One tensor of the file, whichever its container.
struct Source {
  std::string dtype;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t bytes = 0;
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

std::string list(const std::vector<std::string>& names, size_t shown = 6) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < shown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) s += fmt::format(", ... ({} more)", names.size() - shown);
  return s;
}

bool matches(const std::string& name, const std::string& prefix) {
  return name == prefix ||
         (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.');
}

}  // namespace

bool is_pytorch_file(const std::string& path) {
  // Not opened unless a regular file: opening a pipe would wait for a writer for ever.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::byte h[4] = {};
  in.read(reinterpret_cast<char*>(h), 4);
  if (in.gcount() == 4) return looks_like_torch_file(h);
  // Too short to tell by its bytes (an empty download): its name says what it was meant to be,
  // so that the error is the PyTorch reader's, not a safetensors one.
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".pth" || ext == ".pt";
}

std::optional<TorchvisionResnet> torchvision_resnet_of(const TensorShapes& tensors) {
  const bool module = !tensors.empty() && std::all_of(tensors.begin(), tensors.end(),
                                                      [](const auto& t) { return t.first.rfind("module.", 0) == 0; });
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, shape] : tensors) shapes[module ? name.substr(7) : name] = shape;
  auto shape_of = [&](const std::string& name) {
    auto it = shapes.find(name);
    return it == shapes.end() ? std::vector<int64_t>{} : it->second;
  };
  const std::vector<int64_t> conv1 = shape_of("conv1.weight"), fc = shape_of("fc.weight");
  if (conv1 != std::vector<int64_t>{64, 3, 7, 7} || fc.size() != 2 || fc[0] < 1) return std::nullopt;
  const bool bottleneck = shapes.count("layer1.0.conv3.weight") > 0;
  // torchvision's widths: no wide (width_per_group) or grouped (ResNeXt) variant.
  if (shape_of("layer1.0.conv1.weight") != std::vector<int64_t>{64, 64, bottleneck ? 1 : 3, bottleneck ? 1 : 3} ||
      shape_of("layer1.0.conv2.weight") != std::vector<int64_t>{64, 64, 3, 3} || fc[1] != (bottleneck ? 2048 : 512))
    return std::nullopt;
  std::vector<int> depths;
  for (int stage = 1; stage <= 4; ++stage) {
    int blocks = 0;
    while (shapes.count(fmt::format("layer{}.{}.conv1.weight", stage, blocks))) ++blocks;
    depths.push_back(blocks);
  }
  if (shapes.count("layer5.0.conv1.weight")) return std::nullopt;
  static const std::vector<std::tuple<bool, std::vector<int>, const char*>> kNetworks = {
      {false, {2, 2, 2, 2}, "resnet18"},
      {false, {3, 4, 6, 3}, "resnet34"},
      {true, {3, 4, 6, 3}, "resnet50"},
      {true, {3, 4, 23, 3}, "resnet101"},
      {true, {3, 8, 36, 3}, "resnet152"}};
  for (const auto& [b, d, name] : kNetworks)
    if (b == bottleneck && d == depths) return TorchvisionResnet{name, fc[0]};
  return std::nullopt;
}

std::optional<TorchvisionResnet> torchvision_resnet_in(const std::string& path) {
  TensorShapes shapes;
  if (is_pytorch_file(path)) {
    for (const auto& [name, t] : read_torch_state_dict(path).tensors) shapes.emplace_back(name, t.shape);
  } else {
    const SafetensorsFile f = SafetensorsFile::load(path);
    for (const SafetensorsEntry& e : f.entries()) {
      std::vector<int64_t> dims;
      for (int d = 0; d < e.shape.rank(); ++d) dims.push_back(e.shape[d]);
      shapes.emplace_back(e.name, std::move(dims));
    }
  }
  return torchvision_resnet_of(shapes);
}

std::string PretrainedLoad::summary() const {
  std::string s = fmt::format("{} tensors from a {} file", loaded, format);
  if (!key.empty()) s += fmt::format(" (its '{}')", key);
  if (stripped_module) s += ", names without their 'module.' prefix";
  if (!converted.empty()) {
    std::string c;
    for (const auto& d : converted) c += (c.empty() ? "" : ", ") + d;
    s += ", converted from " + c + " to F32";
  }
  if (!excluded.empty()) {
    std::string k;
    for (size_t i = 0; i < excluded.size() && i < 8; ++i) k += (i ? ", " : "") + excluded[i];
    if (excluded.size() > 8) k += fmt::format(", ... ({} more)", excluded.size() - 8);
    s += "; kept as initialised: " + k;
  }
  return s;
}

PretrainedLoad load_pretrained(const std::string& path, Model& model, const std::vector<std::string>& exclude) {
  PretrainedLoad r;
  // The file's tensors by name.
  std::map<std::string, Source> src;
  std::vector<std::string> order;
  std::optional<SafetensorsFile> st;
  std::optional<TorchStateDict> td;
  std::string written_for;
  if (is_pytorch_file(path)) {
    td = read_torch_state_dict(path);
    r.format = "PyTorch " + td->format;
    r.key = td->key;
    for (auto& [name, t] : td->tensors) {
      src[name] = Source{t.dtype, t.shape, t.data.data(), t.data.size()};
      order.push_back(name);
    }
  } else {
    st = SafetensorsFile::load(path);
    r.format = "safetensors";
    for (const SafetensorsEntry& e : st->entries()) {
      const auto raw = st->raw(e.name);
      src[e.name] = Source{e.dtype_tag, dims(e.shape), raw.data(), raw.size()};
      order.push_back(e.name);
    }
    if (auto it = st->metadata().find("model"); it != st->metadata().end()) written_for = it->second;
  }
  const std::string where = "'" + path + "'";
  RN_CHECK(!src.empty()) << where << " holds no tensors";

  // DataParallel and DistributedDataParallel save every name under "module.".
  if (std::all_of(order.begin(), order.end(), [](const std::string& n) { return n.starts_with("module."); })) {
    std::map<std::string, Source> stripped;
    for (auto& n : order) {
      stripped[n.substr(7)] = src[n];
      n = n.substr(7);
    }
    src = std::move(stripped);
    r.stripped_module = true;
  }

  const std::vector<std::string> names = model.names();
  const std::string model_name = model.graph().name;
  for (const std::string& p : exclude) {
    RN_CHECK(std::any_of(names.begin(), names.end(), [&](const std::string& n) { return matches(n, p); }))
        << "model.pretrained_exclude: '" << p << "' names no tensor of " << model_name
        << " (give a tensor name or a prefix of names at a dot: 'fc', 'layer4.2', 'conv1.weight')";
  }
  auto is_excluded = [&](const std::string& n) {
    return std::any_of(exclude.begin(), exclude.end(), [&](const std::string& p) { return matches(n, p); });
  };

  // Check everything first.
  std::set<std::string> stats, wanted(names.begin(), names.end());
  for (const std::string& n : names)
    if (n.ends_with(".running_mean")) stats.insert(n.substr(0, n.size() - 13));
  std::vector<std::string> missing, unknown, wrong;
  std::set<std::string> converted;
  bool fc_mismatch = false;
  for (const std::string& n : names) {
    if (is_excluded(n)) {
      r.excluded.push_back(n);
      continue;
    }
    auto it = src.find(n);
    if (it == src.end()) {
      missing.push_back(n);
      continue;
    }
    const Source& s = it->second;
    const std::vector<int64_t> want = dims(model.named(n).shape);
    if (s.dtype != "F32" && s.dtype != "F16" && s.dtype != "BF16" && s.dtype != "F64") {
      wrong.push_back(fmt::format("'{}' is {}, not a floating type", n, s.dtype));
    } else if (s.shape != want) {
      wrong.push_back(
          fmt::format("'{}' has shape {} in the file, the model's is {}", n, shape_str(s.shape), shape_str(want)));
      if (n.starts_with("fc.")) fc_mismatch = true;
    } else if (s.dtype != "F32") {
      converted.insert(s.dtype);
    }
  }
  for (const std::string& n : order) {
    const bool excluded = is_excluded(n);
    if (wanted.count(n) && !excluded) continue;
    ++r.ignored;
    if (excluded) continue;
    // torchvision's BN counter, which training never reads; a resnet.cpp checkpoint's optimizer state.
    if (n.ends_with(".num_batches_tracked") && stats.count(n.substr(0, n.size() - 20))) continue;
    if (n.starts_with("optimizer.") && st && st->metadata().count("format")) continue;
    unknown.push_back(n);
  }
  if (!missing.empty() || !unknown.empty() || !wrong.empty()) {
    std::string msg = where + " does not fit " + model_name + ": ";
    std::vector<std::string> parts;
    for (size_t i = 0; i < wrong.size() && i < 6; ++i) parts.push_back(wrong[i]);
    if (wrong.size() > 6) parts.push_back(fmt::format("... ({} more of the wrong type or shape)", wrong.size() - 6));
    if (!missing.empty())
      parts.push_back(fmt::format("{} tensor(s) of the model missing: {}", missing.size(), list(missing)));
    if (!unknown.empty())
      parts.push_back(fmt::format("{} tensor(s) the model lacks: {}", unknown.size(), list(unknown)));
    if (!written_for.empty() && written_for != model_name) parts.push_back("the file was written for " + written_for);
    TensorShapes shapes;
    for (const std::string& n : order) shapes.emplace_back(n, src.at(n).shape);
    if (const auto tv = torchvision_resnet_of(shapes); tv && tv->name != model_name)
      parts.push_back(fmt::format("its tensors are torchvision's {} with {}", tv->name,
                                  counted(tv->num_classes, "class", "classes")));
    for (size_t i = 0; i < parts.size(); ++i) msg += (i ? "; " : "") + parts[i];
    // The way out of a classifier of another size, when that is all that differs.
    const bool only_fc =
        missing.empty() && unknown.empty() &&
        std::all_of(wrong.begin(), wrong.end(), [](const std::string& w) { return w.starts_with("'fc."); });
    if (fc_mismatch && only_fc) {
      // Both ways out: a new classifier for training, or the file's own class count.
      const auto fc = src.find("fc.weight");
      msg +=
          ". To train from these weights with a new classifier, leave it out: model.pretrained_exclude=[fc] "
          "(beside model.pretrained, in resnet train)";
      // The file's class count helps only where its classifier reads the model's features and the
      // count is one a model can have; else say what differs.
      const bool model_has_fc = std::find(names.begin(), names.end(), "fc.weight") != names.end();
      if (fc != src.end() && model_has_fc) {
        const std::vector<int64_t>& file = fc->second.shape;
        const std::vector<int64_t> ours = dims(model.named("fc.weight").shape);  // [classes, features]
        if (file.size() != 2) {
          msg += fmt::format(
              "; the file's fc.weight has shape {}, not [classes, features]: it is not a classifier "
              "this model can use",
              shape_str(file));
        } else if (file[1] != ours[1]) {
          msg += fmt::format(
              "; the file's classifier reads {} features and the model's {}: the weights are for "
              "another network",
              file[1], ours[1]);
        } else if (file[0] < 2) {
          msg += fmt::format("; the file's classifier has {}, and resnet.cpp's classifiers have at least 2 classes",
                             counted(file[0], "output", "outputs"));
        } else if (file[0] != ours[0]) {
          msg += fmt::format("; to use the file as it is, give the model its {} classes: model.num_classes={}", file[0],
                             file[0]);
        }
      }
    }
    RN_FAIL() << msg;
  }

  // Then copy.
  for (const std::string& n : names) {
    if (is_excluded(n)) continue;
    const Source& s = src.at(n);
    Tensor t = model.named(n);
    float* dst = t.ptr<float>();
    const size_t count = static_cast<size_t>(t.numel());
    if (s.dtype == "F32") {
      std::memcpy(dst, s.data, count * 4);
    } else if (s.dtype == "F64") {
      for (size_t i = 0; i < count; ++i) {
        double v;
        std::memcpy(&v, s.data + i * 8, 8);
        dst[i] = static_cast<float>(v);
      }
    } else {  // F16 or BF16: the project's conversion, exact to F32
      convert(dst, DType::f32, s.data, s.dtype == "F16" ? DType::f16 : DType::bf16, count);
    }
    ++r.loaded;
  }
  r.converted.assign(converted.begin(), converted.end());
  return r;
}

// Weights that can make the model's outputs NaN, said when they are loaded, converted or exported,
// naming the first few tensors: a NaN or an infinity (which may: an infinite running variance only
// makes its channel output beta), and a negative BN running variance, which does (its square root
// is taken) though every value in the file is finite.
void warn_non_finite(const Model& model, const std::string& source) {
  std::vector<std::string> bad, negative;
  for (const std::string& name : model.names()) {
    Tensor t = model.named(name);
    const float* v = t.ptr<float>();
    const int64_t non_finite = std::count_if(v, v + t.numel(), [](float x) { return !std::isfinite(x); });
    if (non_finite > 0) bad.push_back(fmt::format("'{}' ({} of {} values)", name, non_finite, t.numel()));
    if (name.ends_with("running_var")) {
      const int64_t below = std::count_if(v, v + t.numel(), [](float x) { return x < 0.0f; });
      if (below > 0) negative.push_back(fmt::format("'{}' ({} of {} channels)", name, below, t.numel()));
    }
  }
  const auto first_few = [](const std::vector<std::string>& list) {
    const size_t shown = std::min<size_t>(list.size(), 4);
    return fmt::format("{}{}", fmt::join(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                       list.size() > shown ? ", ..." : "");
  };
  if (!bad.empty())
    RN_LOG_WARN("{}: {} values that are not finite (NaN or infinity): {}; they may make the model's outputs NaN",
                source, counted(static_cast<int64_t>(bad.size()), "tensor holds", "tensors hold"), first_few(bad));
  if (!negative.empty())
    RN_LOG_WARN(
        "{}: {} negative batch-norm running variances: {}; a variance is never negative, and every output of "
        "those channels becomes NaN (or, for a variance between -eps and 0, huge): check how the file was written",
        source, counted(static_cast<int64_t>(negative.size()), "tensor holds", "tensors hold"), first_few(negative));
}

}  // namespace rn

#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/build_info.h"
#include "core/check.h"
#include "core/log.h"
#include "model/safetensors.h"
#include "train/checkpoint_file.h"
#include "train/config.h"

namespace rn {

namespace fs = std::filesystem;

namespace {

// __metadata__ keys. "format": "pt" is the safetensors convention for PyTorch-style files, so
// other tools accept ours; what the file is, for resnet.cpp, is "resnet_cpp.kind".
constexpr const char* kKindKey = "resnet_cpp.kind";
constexpr const char* kVersionKey = "resnet_cpp.version";  // the file format's
// The build that wrote the file (core/build_info.h), for tracing a file to the code; never checked.
constexpr const char* kBuildKey = "resnet_cpp.build";
constexpr const char* kKindCheckpoint = "checkpoint";
constexpr const char* kKindWeights = "weights";
constexpr const char* kTop1Key = "checkpoint.top1";
constexpr const char* kEpochEndKey = "checkpoint.epoch_end";
constexpr std::string_view kMomentumPrefix = "optimizer.momentum.";
constexpr std::string_view kCounterSuffix = ".num_batches_tracked";

std::string format_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);  // 17 significant digits: reads back to the same bits
  return buf;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// ---------------------------------------------------------------------------------------------
// Metadata

std::map<std::string, std::string> base_metadata(const Model& model, const char* kind) {
  return {{"format", "pt"},
          {"source", "resnet.cpp"},
          {kBuildKey, build_description()},
          {"model", model.graph().name},
          {kKindKey, kind},
          {kVersionKey, std::to_string(kCheckpointFormatVersion)}};
}

void put_train_state(std::map<std::string, std::string>& md, const TrainState& st) {
  md["train.epoch"] = std::to_string(st.epoch);
  md["train.step"] = std::to_string(st.step);
  md["train.batch_in_epoch"] = std::to_string(st.batch_in_epoch);
  md["train.best_top1"] = format_double(st.best_top1);
  md["train.global_batch"] = std::to_string(st.global_batch);
  md["train.samples"] = std::to_string(st.train_samples);
  md["train.steps_per_epoch"] = std::to_string(st.steps_per_epoch);
  md["train.rng"] = std::to_string(st.rng[0]) + " " + std::to_string(st.rng[1]) + " " + std::to_string(st.rng[2]) +
                    " " + std::to_string(st.rng[3]);
  md["scaler.scale"] = format_double(st.scaler.scale);
  md["scaler.step"] = std::to_string(st.scaler.step);
  md["scaler.clean_steps"] = std::to_string(st.scaler.clean_steps);
  md["scaler.skipped_steps"] = std::to_string(st.scaler.skipped_steps);
  md["scaler.consecutive_skips"] = std::to_string(st.scaler.consecutive_skips);
  md["config_yaml"] = st.config_yaml;
}

// Reads typed fields out of a file's metadata; every error names the file and the field.
class MetadataReader {
 public:
  MetadataReader(const std::string& path, const std::map<std::string, std::string>& md) : path_(path), md_(md) {}

  const std::string& text(const std::string& key) const {
    auto it = md_.find(key);
    RN_CHECK(it != md_.end()) << "checkpoint '" << path_ << "': metadata field '" << key << "' is missing";
    return it->second;
  }

  template <typename T>
  T integer(const std::string& key) const {
    return parse_integer<T>(key, text(key));
  }

  double real(const std::string& key) const {
    const std::string& s = text(key);
    double v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    RN_CHECK(!s.empty() && ec == std::errc() && end == s.data() + s.size())
        << "checkpoint '" << path_ << "': metadata field '" << key << "' = '" << s << "' is not a number";
    return v;
  }

  template <typename T>
  T parse_integer(const std::string& key, std::string_view s) const {
    T v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    RN_CHECK(!s.empty() && ec == std::errc() && end == s.data() + s.size())
        << "checkpoint '" << path_ << "': metadata field '" << key << "' = '" << s << "' is not an integer"
        << (ec == std::errc::result_out_of_range ? " in range" : "");
    return v;
  }

 private:
  const std::string& path_;
  const std::map<std::string, std::string>& md_;
};

TrainState read_train_state(const std::string& path, const std::map<std::string, std::string>& md) {
  MetadataReader r(path, md);
  TrainState st;
  st.epoch = r.integer<int64_t>("train.epoch");
  st.step = r.integer<int64_t>("train.step");
  st.batch_in_epoch = r.integer<int64_t>("train.batch_in_epoch");
  st.best_top1 = r.real("train.best_top1");
  if (md.count("train.global_batch")) st.global_batch = r.integer<int64_t>("train.global_batch");
  if (md.count("train.samples")) st.train_samples = r.integer<int64_t>("train.samples");
  if (md.count("train.steps_per_epoch")) st.steps_per_epoch = r.integer<int64_t>("train.steps_per_epoch");
  std::istringstream words(r.text("train.rng"));
  std::string word;
  size_t n = 0;
  while (words >> word) {
    RN_CHECK(n < st.rng.size()) << "checkpoint '" << path << "': metadata field 'train.rng' = '" << r.text("train.rng")
                                << "' has more than 4 words";
    st.rng[n++] = r.parse_integer<uint64_t>("train.rng", word);
  }
  RN_CHECK(n == st.rng.size()) << "checkpoint '" << path << "': metadata field 'train.rng' = '" << r.text("train.rng")
                               << "' does not hold 4 words";
  st.scaler.scale = r.real("scaler.scale");
  st.scaler.step = r.integer<int64_t>("scaler.step");
  st.scaler.clean_steps = r.integer<int64_t>("scaler.clean_steps");
  st.scaler.skipped_steps = r.integer<int64_t>("scaler.skipped_steps");
  st.scaler.consecutive_skips = r.integer<int64_t>("scaler.consecutive_skips");
  st.config_yaml = r.text("config_yaml");
  if (auto it = md.find(kBuildKey); it != md.end()) st.written_by = it->second;
  return st;
}

// Checks the kind and format version. `required_kind` nullptr: any resnet.cpp kind, or none
// (a file from another writer, such as the torchvision converter). Returns the kind ("" if none).
std::string check_kind_and_version(const std::string& path, const std::map<std::string, std::string>& md,
                                   const char* required_kind) {
  auto kind_it = md.find(kKindKey);
  if (kind_it == md.end()) {
    RN_CHECK(required_kind == nullptr) << "'" << path << "' is not a resnet.cpp " << required_kind
                                       << ": its metadata has no '" << kKindKey
                                       << "' field (a plain weights file, such as the torchvision converter "
                                          "writes, loads as weights only)";
    return "";
  }
  const std::string& kind = kind_it->second;
  RN_CHECK(kind == kKindCheckpoint || kind == kKindWeights)
      << "'" << path << "': unknown resnet.cpp file kind '" << kind << "' in metadata field '" << kKindKey << "'";
  if (required_kind != nullptr) {
    RN_CHECK(kind == required_kind) << "'" << path << "' is a resnet.cpp " << kind << " file, not a " << required_kind
                                    << (kind == kKindWeights ? ": it holds no optimizer state or training position"
                                                             : "");
  }
  MetadataReader r(path, md);
  const int64_t version = r.integer<int64_t>(kVersionKey);
  RN_CHECK(version >= 1 && version <= kCheckpointFormatVersion)
      << "'" << path << "': format version " << version << " (metadata field '" << kVersionKey << "') is not one "
      << "this build reads (1 to " << kCheckpointFormatVersion << ")"
      << (version > kCheckpointFormatVersion ? "; it was written by a newer resnet.cpp" : "");
  return kind;
}

// ---------------------------------------------------------------------------------------------
// Tensors

// Parameters in forward order (the table holds them in backward order), then running stats.
std::vector<std::pair<std::string, Tensor>> model_tensors(const Model& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  const auto& params = model.params().params;
  for (size_t i = params.size(); i-- > 0;) out.emplace_back(params[i].name, model.param(static_cast<int>(i)));
  for (size_t i = 0; i < model.state_views().size(); ++i)
    out.emplace_back(model.state_views()[i].name, model.state(static_cast<int>(i)));
  return out;
}

std::vector<std::pair<std::string, Tensor>> momentum_tensors(const Model& model, const Optimizer& opt) {
  const auto& params = model.params();
  RN_CHECK(static_cast<int64_t>(opt.state().size()) == params.total)
      << "saving a checkpoint: the optimizer's state has " << opt.state().size() << " floats, model '"
      << model.graph().name << "' has " << params.total;
  std::vector<std::pair<std::string, Tensor>> out;
  // The writer only reads through the views.
  float* base = const_cast<float*>(opt.state().data());
  for (size_t i = params.params.size(); i-- > 0;) {
    const ParamView& v = params.params[i];
    out.emplace_back(std::string(kMomentumPrefix) + v.name, Tensor{base + v.offset, v.shape, DType::f32});
  }
  return out;
}

// One tensor a load expects, and where its floats go.
struct Expected {
  std::string name;
  Shape shape;
  float* dst;
};

std::vector<Expected> expected_model_tensors(Model& model) {
  std::vector<Expected> out;
  for (auto& [name, t] : model_tensors(model)) out.push_back({name, t.shape, t.ptr<float>()});
  return out;
}

std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 6;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kShown) s += ", ... (" + std::to_string(names.size() - kShown) + " more)";
  return s;
}

// Checks that `file` holds every expected tensor as F32 of the right shape, and nothing else
// that `ignorable` does not accept. One error lists every kind of mismatch found.
void check_tensors(const SafetensorsFile& file, const Model& model, const std::vector<Expected>& expected,
                   const std::function<bool(const std::string&)>& ignorable) {
  std::vector<std::string> missing, unknown, wrong;
  std::set<std::string> wanted;
  for (const Expected& e : expected) {
    wanted.insert(e.name);
    const SafetensorsEntry* entry = file.find(e.name);
    if (entry == nullptr) {
      missing.push_back(e.name);
    } else if (entry->dtype_tag != "F32") {
      wrong.push_back("tensor '" + e.name + "' is " + entry->dtype_tag + ", expected F32");
    } else if (entry->shape != e.shape) {
      wrong.push_back("tensor '" + e.name + "' has shape " + entry->shape.str() + " in the file, the model's is " +
                      e.shape.str());
    }
  }
  for (const SafetensorsEntry& entry : file.entries()) {
    if (wanted.count(entry.name) || ignorable(entry.name)) continue;
    // The momentum of an unknown parameter adds nothing to the report of the parameter itself.
    if (starts_with(entry.name, kMomentumPrefix) && file.find(entry.name.substr(kMomentumPrefix.size())) != nullptr &&
        !wanted.count(entry.name.substr(kMomentumPrefix.size())))
      continue;
    unknown.push_back(entry.name);
  }
  if (missing.empty() && unknown.empty() && wrong.empty()) return;
  std::vector<std::string> parts;
  if (!unknown.empty()) parts.push_back(std::to_string(unknown.size()) + " unknown tensor(s): " + name_list(unknown));
  if (!missing.empty()) parts.push_back(std::to_string(missing.size()) + " missing tensor(s): " + name_list(missing));
  for (size_t i = 0; i < wrong.size() && i < 6; ++i) parts.push_back(wrong[i]);
  if (wrong.size() > 6) parts.push_back("... (" + std::to_string(wrong.size() - 6) + " more of wrong dtype or shape)");
  auto it = file.metadata().find("model");
  if (it != file.metadata().end() && it->second != model.graph().name)
    parts.push_back("the file was written for model '" + it->second + "'");
  std::string msg = "'" + file.path() + "' does not fit model '" + model.graph().name + "': ";
  for (size_t i = 0; i < parts.size(); ++i) msg += (i ? "; " : "") + parts[i];
  RN_FAIL() << msg;
}

void copy_tensors(const SafetensorsFile& file, const std::vector<Expected>& expected) {
  for (const Expected& e : expected) {
    Tensor src = file.view(e.name);
    std::memcpy(e.dst, src.data, src.bytes());
  }
}

TrainState load_checkpoint_file(const SafetensorsFile& file, Model& model, Optimizer* opt) {
  const std::string& path = file.path();
  check_kind_and_version(path, file.metadata(), kKindCheckpoint);
  TrainState st = read_train_state(path, file.metadata());

  std::vector<Expected> expected = expected_model_tensors(model);
  std::vector<float> momentum;
  std::set<std::string> momentum_names;
  const ParamTable& table = model.params();
  for (const ParamView& v : table.params) momentum_names.insert(std::string(kMomentumPrefix) + v.name);
  if (opt != nullptr) {
    RN_CHECK(static_cast<int64_t>(opt->state().size()) == table.total)
        << "loading checkpoint '" << path << "': the optimizer's state has " << opt->state().size()
        << " floats, model '" << model.graph().name << "' has " << table.total;
    momentum.assign(static_cast<size_t>(table.total), 0.0f);  // alignment padding stays 0
    for (const ParamView& v : table.params)
      expected.push_back({std::string(kMomentumPrefix) + v.name, v.shape, momentum.data() + v.offset});
  }
  // Without an optimizer, the momentum tensors are skipped, but only those of this model's parameters.
  check_tensors(file, model, expected,
                [&](const std::string& name) { return opt == nullptr && momentum_names.count(name) > 0; });
  copy_tensors(file, expected);
  if (opt != nullptr) opt->set_state(momentum);
  return st;
}

// ---------------------------------------------------------------------------------------------
// Cheap integrity check of a file: header intact, file size exactly what the header describes.
// Catches what a killed copy or a full disk leaves, without reading the data.

struct Probe {
  std::map<std::string, std::string> metadata;
  std::string problem;  // empty: intact
};

Probe probe_safetensors(const std::string& path) {
  Probe p;
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) {
    p.problem = "cannot read its size: " + ec.message();
    return p;
  }
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(len), 8)) {
    p.problem = "shorter than the 8-byte header length";
    return p;
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8 || n > (100u << 20)) {
    p.problem = "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(size) +
                "-byte file (truncated?)";
    return p;
  }
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) {
    p.problem = "cannot read the header";
    return p;
  }
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    p.problem = "the header is not a JSON object";
    return p;
  }
  uint64_t data_end = 0;
  for (auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        p.problem = "__metadata__ is not an object";
        return p;
      }
      for (auto& [k, v] : value.items()) {
        if (v.is_string()) p.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const auto offsets = value.is_object() ? value.find("data_offsets") : value.end();
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[1].is_number_unsigned()) {
      p.problem = "tensor '" + key + "' has no valid data_offsets";
      return p;
    }
    data_end = std::max(data_end, (*offsets)[1].get<uint64_t>());
  }
  if (8 + n + data_end != size) {
    p.problem = "the header describes " + std::to_string(8 + n + data_end) + " bytes, the file has " +
                std::to_string(size) + " (truncated?)";
  }
  return p;
}

// The step number in "step-<digits>.safetensors"; nullopt for any other name.
std::optional<int64_t> parse_step_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step-", kSuffix = ".safetensors";
  if (!starts_with(name, kPrefix) || !ends_with(name, kSuffix)) return std::nullopt;
  std::string_view digits(name.data() + kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int err = fd < 0 || ::fsync(fd) != 0 ? errno : 0;
  if (fd >= 0) ::close(fd);
  RN_CHECK(err == 0) << "fsync of folder '" << dir << "' failed: " << std::strerror(err);
}

void copy_file_atomic(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  RN_CHECK(in) << "copying '" << from << "' to '" << to << "': cannot open the source: " << std::strerror(errno);
  write_file_atomic(to, [&](AtomicFileWriter& w) {
    std::vector<char> chunk(4 << 20);
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      if (in.gcount() > 0) w.write(chunk.data(), static_cast<size_t>(in.gcount()));
    }
    RN_CHECK(in.eof()) << "copying '" << from << "' to '" << to << "': read failed";
  });
}

}  // namespace

// -----------------------------------------------------------------------------------------------
// Files

void save_checkpoint(const std::string& path, const Model& model, const Optimizer& opt, const TrainState& st,
                     const CheckpointTags& tags) {
  std::vector<std::pair<std::string, Tensor>> tensors = model_tensors(model);
  for (auto& t : momentum_tensors(model, opt)) tensors.push_back(std::move(t));
  std::map<std::string, std::string> md = base_metadata(model, kKindCheckpoint);
  put_train_state(md, st);
  md["optimizer.name"] = std::string(enum_name(opt.config().name));
  md[kEpochEndKey] = tags.epoch_end ? "1" : "0";
  if (tags.top1) md[kTop1Key] = format_double(*tags.top1);
  write_safetensors(path, tensors, md);
}

TrainState load_checkpoint(const std::string& path, Model& model, Optimizer* opt) {
  return load_checkpoint_file(SafetensorsFile::load(path), model, opt);
}

void save_weights(const std::string& path, const Model& model, const std::string& config_yaml) {
  std::map<std::string, std::string> md = base_metadata(model, kKindWeights);
  if (!config_yaml.empty()) md["config_yaml"] = config_yaml;
  write_safetensors(path, model_tensors(model), md);
}

void load_weights(const std::string& path, Model& model) {
  SafetensorsFile file = SafetensorsFile::load(path);
  const std::string kind = check_kind_and_version(path, file.metadata(), nullptr);
  std::set<std::string> stats;
  for (const StateView& v : model.state_views()) stats.insert(v.name);
  std::vector<Expected> expected = expected_model_tensors(model);
  check_tensors(file, model, expected, [&](const std::string& name) {
    if (kind == kKindCheckpoint && starts_with(name, "optimizer.")) return true;
    // torchvision's BN counter, which training never reads: accepted beside a BN of this model.
    if (ends_with(name, kCounterSuffix)) {
      return stats.count(name.substr(0, name.size() - kCounterSuffix.size()) + ".running_mean") > 0;
    }
    return false;
  });
  copy_tensors(file, expected);
}

// -----------------------------------------------------------------------------------------------
// Rotation

CheckpointManager::CheckpointManager(std::string run_dir, int64_t keep_last, bool keep_best)
    : dir_((fs::path(std::move(run_dir)) / "checkpoints").string()), keep_last_(keep_last), keep_best_(keep_best) {
  RN_CHECK(keep_last >= 0) << "checkpoint keep_last must be >= 0 (0 keeps all), got " << keep_last;
}

std::string CheckpointManager::best_path() const { return (fs::path(dir_) / "best.safetensors").string(); }

std::string CheckpointManager::step_path(int64_t step) const {
  RN_CHECK(step >= 0) << "checkpoint step must be >= 0, got " << step;
  char name[48];
  std::snprintf(name, sizeof(name), "step-%08lld.safetensors", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::vector<std::string> CheckpointManager::set_aside() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (std::string_view suffix : {kDamagedSuffix, kAbandonedSuffix}) {
      if (ends_with(name, suffix) && parse_step_name(name.substr(0, name.size() - suffix.size())))
        out.push_back(it->path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto step = parse_step_name(name);
    const bool best = name == fs::path(best_path()).filename().string();
    if (!step && !best) continue;
    // A folder (or a link to nothing) under a checkpoint's name: skipped, the run would fail
    // at the save that replaces it, steps later. Said now.
    std::error_code file_ec;
    RN_CHECK(fs::is_regular_file(it->path(), file_ec))
        << "'" << it->path().string() << "' is named like a checkpoint but is not a file ("
        << (fs::is_directory(it->path(), file_ec) ? "a folder" : "a link to nothing or something else")
        << "): move it out of " << dir_;
    if (step) found.emplace_back(*step, it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

void CheckpointManager::remove_temporaries() const {
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().find(".tmp.") != std::string::npos) leftovers.push_back(it->path());
  }
  for (const fs::path& p : leftovers) {
    std::error_code rm;
    fs::remove(p, rm);
    if (rm) {
      RN_LOG_WARN("cannot remove leftover temporary checkpoint file '{}': {}", p.string(), rm.message());
    } else {
      RN_LOG_WARN("removed leftover temporary file '{}' of an interrupted checkpoint write", p.string());
    }
  }
}

std::optional<double> CheckpointManager::best_top1(const Model* model) const {
  std::error_code ec;
  if (!fs::exists(best_path(), ec)) return std::nullopt;
  Probe p = probe_safetensors(best_path());
  if (p.problem.empty() && model != nullptr) {
    // The data too (its CRC) and the tensors: a flipped bit, or a best file of another model
    // copied in, is no baseline for this run's next improvement.
    try {
      const SafetensorsFile file = SafetensorsFile::load(best_path());
      check_kind_and_version(best_path(), file.metadata(), kKindCheckpoint);
      std::vector<Expected> expected;
      for (const auto& [name, t] : model_tensors(*model)) expected.push_back({name, t.shape, nullptr});
      check_tensors(file, *model, expected, [](const std::string& name) { return starts_with(name, kMomentumPrefix); });
    } catch (const Error& e) {
      p.problem = e.what();
    }
  }
  if (!p.problem.empty()) {
    RN_LOG_WARN("best checkpoint '{}' is damaged or not this run's ({}); it will be replaced at the next improvement",
                best_path(), p.problem);
    return std::nullopt;
  }
  auto it = p.metadata.find(kTop1Key);
  if (it == p.metadata.end()) return std::nullopt;
  double v = 0;
  auto [end, err] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  if (err != std::errc() || end != it->second.data() + it->second.size()) return std::nullopt;
  return v;
}

std::string CheckpointManager::save(const Model& model, const Optimizer& opt, const TrainState& st, bool is_epoch_end,
                                    std::optional<double> top1) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  RN_CHECK(!ec) << "cannot create checkpoint folder '" << dir_ << "': " << ec.message();
  remove_temporaries();
  if (!best_read_) {
    best_known_ = best_top1(&model);
    best_read_ = true;
  }
  const bool improved = top1 && (!best_known_ || *top1 > *best_known_);

  TrainState out = st;
  if (top1) out.best_top1 = std::max(out.best_top1, *top1);
  if (best_known_) out.best_top1 = std::max(out.best_top1, *best_known_);
  const std::string path = step_path(st.step);
  save_checkpoint(path, model, opt, out, CheckpointTags{is_epoch_end, top1});
  if (improved) {
    if (keep_best_) update_best(path);
    best_known_ = top1;
  }
  rotate(st.step);
  return path;
}

// best.safetensors becomes a second name of `source` (or a copy where hard links fail),
// replaced atomically: the link is made under a temporary name and renamed over it.
void CheckpointManager::update_best(const std::string& source) {
  const std::string best = best_path();
  const std::string tmp = best + ".tmp." + std::to_string(::getpid()) + ".link";
  ::unlink(tmp.c_str());
  if (::link(source.c_str(), tmp.c_str()) == 0) {
    if (::rename(tmp.c_str(), best.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      RN_FAIL() << "updating '" << best << "': rename from '" << tmp << "' failed: " << std::strerror(err);
    }
    ::unlink(tmp.c_str());  // rename() leaves both names when they already were one file
    fsync_directory(dir_);
  } else {
    RN_LOG_DEBUG("hard link '{}' -> '{}' failed ({}); copying", source, tmp, std::strerror(errno));
    copy_file_atomic(source, best);
  }
  RN_LOG_INFO("new best checkpoint: {} -> {}", source, best);
}

void CheckpointManager::rotate(int64_t step) const {
  // Checkpoints of later steps belong to a line the run has left (it resumed from an older
  // checkpoint); left in place, the next resume would take them for the newest. They are set
  // aside, not deleted: the user may want to compare.
  std::vector<std::string> kept;
  for (const std::string& p : checkpoints()) {
    if (parse_step_name(fs::path(p).filename().string()).value_or(0) <= step) {
      kept.push_back(p);
      continue;
    }
    std::error_code ec;
    fs::rename(p, p + kAbandonedSuffix, ec);
    if (ec) {
      RN_LOG_WARN("cannot set aside checkpoint '{}' of a later step than {}: {}", p, step, ec.message());
    } else {
      RN_LOG_WARN("checkpoint '{}' is of a later step than {} (the run resumed from an older one): renamed to '{}'", p,
                  step, p + kAbandonedSuffix);
    }
  }
  if (keep_last_ == 0) return;
  for (size_t i = 0; i + static_cast<size_t>(keep_last_) < kept.size(); ++i) {  // oldest first
    std::error_code ec;
    fs::remove(kept[i], ec);
    if (ec) {
      RN_LOG_WARN("cannot remove old checkpoint '{}': {}", kept[i], ec.message());
    } else {
      RN_LOG_DEBUG("removed old checkpoint '{}'", kept[i]);
    }
  }
}

std::optional<std::string> CheckpointManager::latest() const {
  remove_temporaries();
  std::vector<std::string> all = checkpoints();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Probe p = probe_safetensors(*it);
    if (p.problem.empty() && p.metadata.count(kKindKey) && p.metadata.at(kKindKey) == kKindCheckpoint) return *it;
    RN_LOG_WARN("skipping damaged checkpoint '{}': {}", *it, p.problem.empty() ? "not a checkpoint" : p.problem);
  }
  return std::nullopt;
}

std::optional<LoadedCheckpoint> CheckpointManager::latest_loadable(Model& model, Optimizer* opt,
                                                                   bool set_aside_damaged) const {
  remove_temporaries();
  std::vector<std::string> all = checkpoints();
  // A damaged file left under its name would count in the rotation as if it were a checkpoint:
  // the next saves would delete the good older ones and keep it.
  auto skip = [&](const std::string& path, const std::string& problem) {
    std::string where;
    if (set_aside_damaged) {
      std::error_code ec;
      fs::rename(path, path + kDamagedSuffix, ec);
      where = ec ? fmt::format(" (cannot rename it: {})", ec.message())
                 : fmt::format(" (renamed to '{}{}')", path, kDamagedSuffix);
    }
    RN_LOG_WARN("skipping damaged checkpoint '{}': {}{}; trying the next older one", path, problem, where);
  };
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Probe p = probe_safetensors(*it);
    if (p.problem.empty() && (!p.metadata.count(kKindKey) || p.metadata.at(kKindKey) != kKindCheckpoint))
      p.problem = "not a resnet.cpp checkpoint";
    if (!p.problem.empty()) {
      skip(*it, p.problem);
      continue;
    }
    std::optional<SafetensorsFile> file;
    try {
      file.emplace(SafetensorsFile::load(*it));
    } catch (const Error& e) {
      skip(*it, e.what());
      continue;
    }
    // A format this build does not read is not damage (a newer resnet.cpp wrote it): thrown.
    check_kind_and_version(*it, file->metadata(), kKindCheckpoint);
    // A position that does not parse is (files without a header CRC, as older builds wrote,
    // can hold a flipped bit there).
    try {
      read_train_state(*it, file->metadata());
    } catch (const Error& e) {
      skip(*it, e.what());
      continue;
    }
    // An intact file that does not fit the model is the caller's problem, not damage: thrown.
    TrainState st = load_checkpoint_file(*file, model, opt);
    return LoadedCheckpoint{*it, std::move(st)};
  }
  return std::nullopt;
}

}  // namespace rn

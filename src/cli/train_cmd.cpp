// `resnet train`, `resnet eval` and `resnet export`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/format.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "core/plural.h"
#include "core/thread_pool.h"
#include "data/encoded_dataset.h"
#include "data/idx_dataset.h"
#include "data/loader.h"
#include "data/shard_format.h"
#include "data/transform.h"
#include "dist/world.h"
#include "model/model.h"
#include "model/onnx_export.h"
#include "model/safetensors.h"
#include "model/torch_file.h"
#include "model/zoo.h"
#include "ops/backend.h"
#include "train/batch_feeder.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data_setup.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/precision.h"
#include "train/pretrained.h"
#include "train/trainer.h"

namespace rn::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string resume;
  std::string data;
  int64_t max_steps = 0;
};

// RGB photos with ImageNet's normalisation, as torchvision's models are trained.
std::vector<std::string> imagenet_input_sets() {
  return {"data.dataset=imagefolder", "model.in_channels=3", "data.mean=[0.485, 0.456, 0.406]",
          "data.std=[0.229, 0.224, 0.225]"};
}

// The classes of the training split under a data root (root/train when there is one): a
// packed folder's recorded classes, else its class folders, counted without listing their
// images. 0 when there is no such folder (the loaders then say what is wrong).
int64_t count_classes(const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path split = fs::is_directory(fs::path(root) / "train", ec) ? fs::path(root) / "train" : fs::path(root);
  const fs::path manifest = split / std::string(kShardManifestName);
  if (fs::exists(manifest, ec)) {
    try {
      return static_cast<int64_t>(
          parse_shard_manifest(read_text_file(manifest.string()), manifest.string()).classes.size());
    } catch (const Error&) {
      return 0;
    }
  }
  int64_t n = 0;
  for (fs::directory_iterator it(split, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec)) ++n;
  return ec ? 0 : n;
}

// The number of classes a `--set data.classes=[...]` among `user_sets` lists (the last one
// wins, as in the config), or 0 when there is none. Read by the config's own override parser;
// an override it refuses is refused again, with its message, when the config is loaded.
int64_t classes_listed(const std::vector<std::string>& user_sets) {
  Config c;
  for (const std::string& o : user_sets) {
    try {
      apply_config_override(c, o);
    } catch (const Error&) {
    }
  }
  return static_cast<int64_t>(c.data.classes.size());
}

// --data PATH: an image folder (root/<class>/*.jpg, or root/train + root/val) with
// ImageNet's normalisation and, without --config, as many model outputs as it has classes (as
// a `--set data.classes` lists, which may name classes the folder lacks); the user's own --set
// options come after and win.
std::vector<std::string> data_sets_for(const std::string& path, bool has_config,
                                       const std::vector<std::string>& user_sets) {
  if (path.empty()) return {};
  std::vector<std::string> sets = imagenet_input_sets();
  sets.push_back("data.root=" + path);
  const int64_t listed = classes_listed(user_sets);
  const int64_t classes = listed > 0 ? listed : count_classes(path);
  // Said here, not as a model.num_classes=1 the user never wrote.
  RN_CHECK(classes != 1) << "--data " << path
                         << ": the training images are all of one class (one class folder), and a classifier needs "
                            "at least 2; give the folder above the class folders";
  if (!has_config && classes > 0) sets.push_back("model.num_classes=" + std::to_string(classes));
  return sets;
}

int run_train(const TrainArgs& a) {
  RN_CHECK(a.resume.empty() || (a.data.empty() && a.config.empty()))
      << "--resume continues a run with the config in its folder; --data and --config cannot change it";
  std::vector<std::string> sets = data_sets_for(a.data, !a.config.empty(), a.sets);
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  // Resuming, the run's own config wins; --set may change only keys that cannot change results
  // (checked by train()).
  Config cfg = a.resume.empty() ? load_config(a.config, sets) : load_config("", {});
  install_stop_signal_handlers();
  TrainOptions o;
  o.resume_dir = a.resume;
  if (!a.resume.empty()) o.resume_overrides = a.sets;
  o.max_steps = a.max_steps;
  const TrainResult r = train(cfg, o);
  const bool writer = !current_world() || current_world()->writer();
  shutdown_world();  // every rank leaves MPI together
  if (!writer) return r.interrupted ? 130 : 0;
  // "60 steps in 3.5 s", or after a resume "60 steps (21 in this session, 1.5 s)".
  const std::string steps =
      r.session_steps == r.steps
          ? fmt::format("{} in {:.1f} s", counted(r.steps, "step"), r.seconds)
          : fmt::format("{} ({} in this session, {:.1f} s)", counted(r.steps, "step"), r.session_steps, r.seconds);
  if (r.complete && r.final_eval.samples > 0)
    fmt::print("final: top-1 {:.2f}%, top-5 {:.2f}%, loss {:.4f}; best top-1 {:.2f}%; {}; run {}\n",
               100 * r.final_eval.top1, 100 * r.final_eval.top5, r.final_eval.loss, 100 * r.best_top1, steps,
               r.run_dir);
  else if (r.complete)  // a resume of a finished run: nothing was left to do
    fmt::print(
        "the run in {} is complete ({}): nothing left to train; its last checkpoint and report are "
        "there\n",
        r.run_dir, counted(r.steps, "step"));
  else  // stopped before the end: the last evaluation, if any, is not the final one
    fmt::print(
        "{} after {}{}; resume with: resnet train --resume {}\n", r.interrupted ? "interrupted" : "stopped", steps,
        r.final_eval.samples > 0 ? fmt::format("; last evaluation: top-1 {:.2f}%, top-5 {:.2f}%, loss {:.4f}",
                                               100 * r.final_eval.top1, 100 * r.final_eval.top5, r.final_eval.loss)
                                 : std::string(),
        r.run_dir);
  return r.interrupted ? 130 : 0;
}

struct EvalArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string weights;
  std::string data;
  std::string predictions;
};

// A weights file that is not there is named as missing, not as a file of the wrong kind.
void check_weights_exist(const std::string& path, const char* what) {
  std::error_code ec;
  // A run folder: name the file it keeps its best weights in.
  const std::filesystem::path best = std::filesystem::path(path) / "checkpoints" / "best.safetensors";
  RN_CHECK(!std::filesystem::is_directory(path, ec) || !std::filesystem::exists(best, ec))
      << what << " '" << path << "' is a run folder; give one of its weights files, such as " << best.string();
  RN_CHECK(std::filesystem::is_regular_file(path, ec))
      << what << " '" << path << "' " << (std::filesystem::exists(path, ec) ? "is not a file" : "does not exist");
}

// The number of classes of the classifier in a weights file for `model`: the rows of its
// fc.weight when that is a matrix as wide as the model's features (whatever the rest of the file
// is, which the strict load checks), else nothing.
std::optional<int64_t> classes_in_file(const std::string& path, const std::string& model) {
  // An unknown name is left to the config, which says what the names are.
  const std::vector<std::string> known = model_names();
  if (std::find(known.begin(), known.end(), model) == known.end()) return std::nullopt;
  const Graph g = build_model(model, default_model_options(model));
  int64_t features = 0;
  for (const Node& n : g.nodes())
    if (const auto* l = attrs_if<LinearAttrs>(n); l && n.name == "fc") features = l->in_features;
  std::vector<int64_t> fc;
  if (is_pytorch_file(path)) {
    for (const auto& [name, t] : read_torch_state_dict(path).tensors)
      if (name == "fc.weight" || name == "module.fc.weight") fc = t.shape;
  } else {
    const SafetensorsFile f = SafetensorsFile::load(path);
    for (const SafetensorsEntry& e : f.entries())
      if (e.name == "fc.weight" || e.name == "module.fc.weight")
        for (int i = 0; i < e.shape.rank(); ++i) fc.push_back(e.shape[i]);
  }
  if (fc.size() != 2 || fc[1] != features || features == 0) return std::nullopt;
  return fc[0];
}

// torchvision's setting for one of its ImageNet ResNets: 224x224 RGB photos (resized to 256
// for evaluation) with ImageNet's mean and std, from an image folder.
std::vector<std::string> torchvision_sets(const std::string& model, int64_t num_classes, const std::string& source) {
  RN_CHECK(num_classes >= 2) << source << " holds a " << model << " whose classifier has " << num_classes
                             << " output; resnet.cpp's classifiers have at least 2 classes";
  // No data folder: the weights came without one (the built-in default is Fashion-MNIST's, which
  // a file written by import or export would record as its data, and eval would then read).
  std::vector<std::string> sets = {"model.name=" + model, "model.num_classes=" + std::to_string(num_classes),
                                   "model.image_size=224", "data.augment.eval_resize=256", "data.root="};
  const std::vector<std::string> imagenet = imagenet_input_sets();
  sets.insert(sets.end(), imagenet.begin(), imagenet.end());
  return sets;
}

bool sets_key(const std::vector<std::string>& sets, const std::string& key) {
  return std::any_of(sets.begin(), sets.end(), [&](const std::string& s) { return s.rfind(key + "=", 0) == 0; });
}

// The config of a checkpoint (recorded in its metadata), else the given one. A file that
// records none (a PyTorch state dict, a converted torchvision file) and whose tensors are a
// torchvision ResNet gets torchvision's setting for it, unless --config or model.name says
// otherwise; --set changes any of it.
// `recorded`, when given, says whether the config came with the weights (a checkpoint's) rather
// than from --config, --set or torchvision's setting.
// The config a resnet.cpp weights file or checkpoint records; empty for other files.
std::string recorded_config(const std::string& path) {
  if (is_pytorch_file(path)) return {};
  const SafetensorsFile f = SafetensorsFile::load(path);
  const auto it = f.metadata().find("config_yaml");
  return it != f.metadata().end() ? it->second : std::string();
}

Config config_for_weights(const EvalArgs& a, bool* recorded = nullptr) {
  check_weights_exist(a.weights, "--weights");
  if (recorded) *recorded = false;
  if (!a.config.empty()) return load_config(a.config, a.sets);
  if (const std::string yaml = recorded_config(a.weights); !yaml.empty()) {
    if (recorded) *recorded = true;
    return load_config_from_string(yaml, a.sets, a.weights + " (embedded config)");
  }
  std::vector<std::string> sets;
  if (!sets_key(a.sets, "model.name")) {
    if (const auto tv = torchvision_resnet_in(a.weights)) {
      RN_LOG_INFO(
          "{} records no config; its tensors are torchvision's {} with {}: using torchvision's "
          "224x224 RGB input and ImageNet's mean and std (--set changes any of it)",
          a.weights, tv->name, counted(tv->num_classes, "class", "classes"));
      sets = torchvision_sets(tv->name, tv->num_classes, a.weights);
    } else {
      // Not the built-in Fashion-MNIST recipe's resnet20, which the user never named.
      RN_FAIL() << a.weights
                << " records no config and its tensors are not one of torchvision's ResNets: say which model they "
                   "are for with --config, or --set model.name=... (and model.num_classes, model.in_channels, "
                   "model.image_size as the weights need)";
    }
  }
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  return load_config("", sets);
}

// Our checkpoints and weights files; a PyTorch state dict through the same strict load as
// model.pretrained.
void load_model_weights(const std::string& path, Model& model) {
  if (is_pytorch_file(path)) {
    const PretrainedLoad r = load_pretrained(path, model);
    RN_LOG_INFO("{}: {}", path, r.summary());
  } else {
    load_weights(path, model);
  }
  warn_non_finite(model, path);
}

int run_eval(const EvalArgs& a) {
  bool recorded = false;
  Config cfg = config_for_weights(a, &recorded);
  set_host_threads(static_cast<int>(cfg.run.threads));
  if (!a.data.empty()) {
    // A model trained on IDX files (Fashion-MNIST) reads IDX files: an image folder does not fit it.
    const std::string idx =
        cfg.data.dataset == DatasetKind::fashion_mnist ? fashion_mnist_images_path(a.data, Split::test) : "";
    std::error_code ec;
    RN_CHECK(idx.empty() || std::filesystem::exists(idx, ec))
        << "resnet eval: " << a.weights << " is a model of Fashion-MNIST's " << cfg.model.in_channels << "-channel "
        << cfg.model.image_size[0] << "x" << cfg.model.image_size[1] << " images, read from IDX files, and --data "
        << a.data << " has none (" << idx
        << "): give the folder of the IDX files, or weights trained on images like those in " << a.data;
    cfg.data.root = a.data;
  } else if ((!recorded || cfg.data.root.empty()) && a.config.empty() && cfg.data.dataset == DatasetKind::imagefolder) {
    RN_FAIL() << "resnet eval: " << a.weights
              << " records no dataset (weights from elsewhere): give the images to evaluate with --data DIR (an image "
                 "folder of class folders, or a packed folder)";
  } else if (cfg.data.dataset == DatasetKind::imagefolder && !std::filesystem::is_directory(cfg.data.root)) {
    RN_FAIL() << "resnet eval: data.root '" << cfg.data.root << "'"
              << (recorded ? " (from " + a.weights + "'s recorded config)" : std::string())
              << " is not a folder here; give the images with --data DIR";
  }
  auto backend = make_backend_for(cfg.run.device, backend_options_for(cfg.run));
  const PrecisionPolicy policy = make_precision_policy(cfg.precision, *backend);
  Model model(build_model(cfg.model.name, model_options(cfg.model)));
  load_model_weights(a.weights, model);
  const DType loader_dtype = loader_dtype_for(policy.activation_dtype, *backend);
  std::unique_ptr<DataLoader> loader_ptr =
      make_val_loader(cfg, loader_dtype, backend->preferred_layout(), &backend->pinned_memory());
  DataLoader& loader = *loader_ptr;
  const DataLoaderOptions& lo = loader.options();
  PlanOptions po;
  po.dtype = policy.conv_dtype;
  po.activation_dtype = policy.activation_dtype;
  po.layout = lo.layout;
  Evaluator ev(model, *backend, po);
  // Checked before the evaluation, so that a path that cannot be written fails now, not after the
  // work; written (atomically) after it, so that an evaluation that fails leaves an existing file
  // as it was.
  if (!a.predictions.empty()) check_output_path(a.predictions, "--predictions");
  std::vector<Prediction> preds;
  const EvalResult r = ev.run(loader, 0, a.predictions.empty() ? nullptr : &preds);
  fmt::print("{} on {} ({} images{}): loss {:.4f}, top-1 {:.2f}%, top-5 {:.2f}%\n", a.weights, loader.dataset().name(),
             r.samples,
             r.unreadable > 0 ? fmt::format("; {} left out", counted(r.unreadable, "unreadable file")) : std::string(),
             r.loss, 100 * r.top1, 100 * r.top5);
  if (!a.predictions.empty()) {
    // The image each row is about, for image folders and shards (quoted: paths may hold commas).
    const auto* encoded = dynamic_cast<const EncodedDataset*>(&loader.dataset());
    auto quoted = [](const std::string& text) {
      std::string s = "\"";
      for (char c : text) s += c == '"' ? std::string("\"\"") : std::string(1, c);
      return s + "\"";
    };
    auto source_of = [&](int64_t index) { return encoded ? quoted(encoded->source(index)) : std::string(); };
    // Class names where the data has them: those the run recorded (data.classes), else the
    // folder's, else Fashion-MNIST's; a list file's labels are positions, with no names.
    const std::vector<std::string>& names = !cfg.data.classes.empty()                     ? cfg.data.classes
                                            : encoded && !encoded->labels_are_positions() ? encoded->classes()
                                            : cfg.data.dataset == DatasetKind::fashion_mnist
                                                ? fashion_mnist_class_names()
                                                : cfg.data.classes;
    auto name_of = [&](int64_t label) {
      return label >= 0 && label < static_cast<int64_t>(names.size()) ? quoted(names[static_cast<size_t>(label)])
                                                                      : std::string();
    };
    std::ostringstream out;
    out << "index,label";
    for (int j = 1; j <= 5; ++j) out << ",class" << j << ",prob" << j;
    out << ",source";
    if (!names.empty()) out << ",label_name,name1,name2,name3,name4,name5";
    out << "\n";
    for (const Prediction& p : preds) {
      out << p.index << "," << p.label;
      for (int j = 0; j < 5; ++j) {
        if (j < p.k)
          out << "," << p.classes[j] << "," << fmt::format("{:.6f}", p.probs[j]);
        else
          out << ",,";
      }
      out << "," << source_of(p.index);
      if (!names.empty()) {
        out << "," << name_of(p.label);
        for (int j = 0; j < 5; ++j) out << "," << (j < p.k ? name_of(p.classes[j]) : std::string());
      }
      out << "\n";
    }
    write_file_atomic(a.predictions, out.str());
    fmt::print("wrote {} predictions to {}\n", preds.size(), a.predictions);
  }
  return 0;
}

struct ExportArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string weights;
  std::string out;
  std::string sample;
};

// --sample PREFIX: a batch of two standard-normal inputs (already "normalised", NCHW fp32) and
// the logits our CPU backend computes for them in evaluation mode, as raw little-endian fp32,
// so that another runtime's output can be checked against ours (tools/onnx_check.py).
void write_sample(const std::string& prefix, Model& model, const ModelOptions& mo) {
  const std::string input_path = prefix + ".input.f32", logits_path = prefix + ".logits.f32";
  check_output_path(input_path, "--sample");
  auto backend = make_backend("cpu");
  const ExportSample sample = export_sample(model, *backend, 2, 20261202);
  const Tensor x = sample.input.view(), logits = sample.logits.view();
  write_file_atomic(input_path, x.data, x.bytes());
  write_file_atomic(logits_path, logits.data, logits.bytes());
  fmt::print("wrote {} ([2, {}, {}, {}] fp32) and {} ([2, {}] fp32, our CPU backend's logits for it)\n", input_path,
             mo.in_channels, mo.height, mo.width, logits_path, mo.num_classes);
}

// The file name's extension in lower case: ".onnx", ".pth", "" (none).
std::string lower_extension(const std::string& path) {
  std::string e = std::filesystem::path(path).extension().string();
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e;
}

// resnet export and import write safetensors (or ONNX); a PyTorch-looking name would send the
// file to torch.load, which cannot read it.
void check_weights_output_name(const std::string& out, const char* command) {
  const std::string e = lower_extension(out);
  RN_CHECK(e != ".pth" && e != ".pt" && e != ".bin" && e != ".ckpt" && e != ".tar")
      << "resnet " << command << " writes safetensors" << (std::string(command) == "export" ? " or ONNX" : "")
      << ", which torch.load cannot read, so '" << out
      << "' would mislead: name it .safetensors (PyTorch reads it with safetensors.torch.load_file; "
         "tools/torchvision_to_safetensors.py --reverse makes a state dict of it)";
}

int run_export(const ExportArgs& a) {
  check_weights_output_name(a.out, "export");
  check_output_path(a.out, "--out");
  EvalArgs ea;
  ea.config = a.config;
  ea.sets = a.sets;
  ea.weights = a.weights;
  const Config cfg = config_for_weights(ea);
  const ModelOptions mo = model_options(cfg.model);
  Model model(build_model(cfg.model.name, mo));
  load_model_weights(a.weights, model);
  if (!a.sample.empty()) write_sample(a.sample, model, mo);
  if (lower_extension(a.out) == ".onnx") {
    const OnnxExportInfo info = save_onnx(a.out, model);
    fmt::print(
        "wrote {} ({}, ONNX opset {}: {} nodes, {} initializers, {:.1f} MB); input \"input\" [N, {}, {}, {}] "
        "normalised with mean {} and std {} (not in the graph), output \"logits\" [N, {}]\n",
        a.out, cfg.model.name, kOnnxOpset, info.nodes, info.initializers, 1e-6 * static_cast<double>(info.bytes),
        mo.in_channels, mo.height, mo.width, fmt::join(cfg.data.mean, ", "), fmt::join(cfg.data.std, ", "),
        mo.num_classes);
    if (!a.sample.empty()) {
      const auto abs = [](const std::string& p) { return std::filesystem::absolute(p).string(); };
      fmt::print(
          "check it from the resnet.cpp source folder: /usr/bin/python3 tools/onnx_check.py {} --input {} --logits "
          "{}\n",
          abs(a.out), abs(a.sample + ".input.f32"), abs(a.sample + ".logits.f32"));
    }
    return 0;
  }
  save_weights(a.out, model, cfg.to_yaml());
  fmt::print("wrote {} ({} parameters and running stats, torchvision names)\n", a.out, model.names().size());
  return 0;
}

struct ImportArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string source;
  std::string model;
  std::string out;
};

// `resnet import resnet50-0676ba61.pth --model resnet50 --out resnet50.safetensors`: a PyTorch
// state dict (or any weights load_pretrained reads) checked against the model, name by name and
// shape by shape, and written as a resnet.cpp weights file whose embedded config lets `resnet
// eval` and `model.pretrained` use it as it is.
int run_import(const ImportArgs& a) {
  RN_CHECK(lower_extension(a.out) != ".onnx")
      << "resnet import writes a safetensors weights file, not '" << a.out
      << "'; import first, then: resnet export --weights W.safetensors --out " << a.out;
  check_weights_output_name(a.out, "import");
  check_output_path(a.out, "--out");
  check_weights_exist(a.source, "resnet import:");
  std::string model_name = a.model;
  std::optional<TorchvisionResnet> tv;
  // A resnet.cpp weights file or checkpoint carries its config: that is the model, unless told
  // otherwise.
  const bool unnamed = model_name.empty() && a.config.empty() && !sets_key(a.sets, "model.name");
  const std::string embedded = unnamed ? recorded_config(a.source) : std::string();
  if (unnamed && embedded.empty()) {
    tv = torchvision_resnet_in(a.source);
    RN_CHECK(tv) << "resnet import: " << a.source
                 << " is not one of torchvision's ResNets by its tensors; name the model the weights are for: "
                    "--model resnet50 (or --config, or --set model.name=...)";
    model_name = tv->name;
    fmt::print("{}: torchvision's {} with {}, by its tensors\n", a.source, tv->name,
               counted(tv->num_classes, "class", "classes"));
  }
  std::vector<std::string> sets;
  if (!model_name.empty()) {
    // The ImageNet ResNets as torchvision trains them: 224x224 RGB photos, 1000 classes (or the
    // file's, when its classifier says so).
    static const std::set<std::string> kImageNet = {"resnet18",  "resnet34",  "resnet50",
                                                    "resnet101", "resnet152", "resnet50_gdw"};
    const std::optional<int64_t> classes = classes_in_file(a.source, model_name);
    if (kImageNet.count(model_name)) {
      sets = torchvision_sets(model_name, classes.value_or(1000), a.source);
    } else {
      sets.push_back("model.name=" + model_name);
      if (classes) {
        RN_CHECK(*classes >= 2) << a.source << " holds a " << model_name << " whose classifier has "
                                << counted(*classes, "output", "outputs")
                                << "; resnet.cpp's classifiers have at least 2 classes";
        sets.push_back("model.num_classes=" + std::to_string(*classes));
      }
    }
  }
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  const Config cfg = embedded.empty() ? load_config(a.config, sets)
                                      : load_config_from_string(embedded, a.sets, a.source + " (embedded config)");
  Model model(build_model(cfg.model.name, model_options(cfg.model)));
  const PretrainedLoad r = load_pretrained(a.source, model);
  warn_non_finite(model, a.source);
  save_weights(a.out, model, cfg.to_yaml());
  fmt::print("imported {} into {}: {}{}, {}", a.source, a.out, cfg.model.name,
             embedded.empty() ? "" : " as its embedded config describes it", r.summary());
  if (r.ignored > 0) fmt::print("; {} tensor(s) not needed (BN counters, optimizer state)", r.ignored);
  fmt::print("\n");
  return 0;
}

// `config_default`: what stands in for --config when it is not given.
// `example`: a key the command uses, for --set's help.
void add_config_options(CLI::App* cmd, std::string& config, std::vector<std::string>& sets,
                        const char* config_default = "the built-in resnet20 Fashion-MNIST recipe",
                        const char* example = "optimizer.base_lr=0.1") {
  cmd->add_option("--config", config, fmt::format("YAML config (default: {})", config_default));
  cmd->add_option("--set", sets, fmt::format("Override a config key: --set {} (repeatable)", example));
}

}  // namespace

std::vector<std::string> data_sets(const std::string& path, bool has_config,
                                   const std::vector<std::string>& user_sets) {
  return data_sets_for(path, has_config, user_sets);
}

Runner add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model (default: resnet20 on Fashion-MNIST); see docs/config.md for every config key");
  add_config_options(cmd, a->config, a->sets);
  cmd->add_option("--resume", a->resume, "Continue the run in this folder from its last checkpoint");
  cmd->add_option("--data", a->data,
                  "Train on an image folder (root/<class>/*.jpg, or root/train and root/val): shorthand for "
                  "data.dataset=imagefolder, data.root, model.in_channels=3, ImageNet mean/std and (without "
                  "--config) model.num_classes from its class folders; --set wins");
  cmd->add_option("--max-steps", a->max_steps, "Stop with a checkpoint after this many steps in total")
      ->check(positive_number());
  return [cmd, a]() -> int { return cmd->parsed() ? run_train(*a) : -1; };
}

Runner add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate weights on a test set: loss, top-1, top-5, predictions");
  add_config_options(cmd, a->config, a->sets,
                     "the config the weights record, else torchvision's setting for the ResNet its tensors are",
                     "data.root=DIR");
  cmd->add_option("--weights", a->weights,
                  "A checkpoint or weights file (.safetensors), or a PyTorch state dict (.pth); a torchvision "
                  "ResNet is recognised by its tensors, other weights without a recorded config need --config or "
                  "--set model.name=...")
      ->required();
  cmd->add_option("--data", a->data, "Data folder (overrides data.root)");
  cmd->add_option("--predictions", a->predictions, "Write per-image top-5 classes and probabilities to this CSV");
  return [cmd, a]() -> int { return cmd->parsed() ? run_eval(*a) : -1; };
}

Runner add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's weights as a torchvision-named safetensors file, or (--out X.onnx) the inference "
      "graph with its weights as ONNX");
  add_config_options(cmd, a->config, a->sets,
                     "the config the weights record, else torchvision's setting for the ResNet its tensors are",
                     "model.name=resnet50");
  cmd->add_option("--weights", a->weights, "A checkpoint or weights file, or a PyTorch state dict (.pth)")->required();
  cmd->add_option("--out", a->out, "Output: .onnx writes ONNX (opset 13), any other name safetensors")->required();
  cmd->add_option("--sample", a->sample,
                  "Also write PREFIX.input.f32 (two random normalised images, NCHW fp32) and PREFIX.logits.f32 (our "
                  "logits for them), for tools/onnx_check.py");
  return [cmd, a]() -> int { return cmd->parsed() ? run_export(*a) : -1; };
}

Runner add_import_command(CLI::App& app) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "import",
      "Check a PyTorch .pth state dict (torchvision's weights, a training script's checkpoint; read without Python) "
      "or a safetensors file against a model, and write it as a resnet.cpp weights file");
  add_config_options(cmd, a->config, a->sets,
                     "a resnet.cpp file's own recorded config, else torchvision's setting for the ResNet its tensors "
                     "are",
                     "model.num_classes=10");
  cmd->add_option("source", a->source, "torch.save file (.pth, .pt, .tar) or safetensors file")->required();
  cmd->add_option("--model", a->model,
                  "Model of the weights (model.name); an ImageNet model also sets 224x224 RGB input, ImageNet's "
                  "normalisation and the file's classes (1000 for torchvision's), which --set can change. Without it, "
                  "a torchvision ResNet is recognised by its tensors");
  cmd->add_option("--out", a->out, "The weights file to write (.safetensors)")->required();
  return [cmd, a]() -> int { return cmd->parsed() ? run_import(*a) : -1; };
}

}  // namespace rn::cli

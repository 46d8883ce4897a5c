#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/rng.h"
#include "log_capture.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "test_dir.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

Model make_model(const std::string& name, uint64_t seed, int64_t classes = 10) {
  ModelOptions o;
  o.num_classes = classes;
  o.in_channels = 1;
  o.height = o.width = 28;
  Model m(build_model(name, o));
  m.init(seed);
  return m;
}

// Every parameter and running stat (padding excluded) set to values no init produces.
void fill_random(Model& m, uint64_t seed) {
  Rng rng(seed);
  for (const std::string& n : m.names()) {
    Tensor t = m.named(n);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = rng.uniform(-3.0f, 3.0f);
  }
}

void fill_momentum(const Model& m, Optimizer& opt, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> s(static_cast<size_t>(m.params().total), 0.0f);
  for (const ParamView& v : m.params().params)
    for (int64_t i = 0; i < v.numel; ++i) s[static_cast<size_t>(v.offset + i)] = rng.normal();
  opt.set_state(s);
}

// Tensors of `a` and `b` that differ in any bit.
std::vector<std::string> differing(const Model& a, const Model& b) {
  std::vector<std::string> out;
  for (const std::string& n : a.names()) {
    Tensor x = a.named(n), y = b.named(n);
    if (x.shape != y.shape || std::memcmp(x.data, y.data, x.bytes()) != 0) out.push_back(n);
  }
  return out;
}

TrainState odd_state() {
  TrainState st;
  st.epoch = 3;
  st.step = 1234567;
  st.batch_in_epoch = 89;
  st.best_top1 = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  st.rng = {0, 1, std::numeric_limits<uint64_t>::max(), 0x8000000000000001ull};
  st.scaler.scale = 65536.0 / 3.0;
  st.scaler.step = 77;
  st.scaler.clean_steps = 5;
  st.scaler.skipped_steps = 2;
  st.scaler.consecutive_skips = 1;
  st.config_yaml = "model:\n  name: resnet20\n# \"quoted\" \\ backslash, unicode: \xc3\xa9\n";
  return st;
}

void expect_same_state(const TrainState& a, const TrainState& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.batch_in_epoch, b.batch_in_epoch);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.best_top1), std::bit_cast<uint64_t>(b.best_top1));
  EXPECT_EQ(a.rng, b.rng);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.scaler.scale), std::bit_cast<uint64_t>(b.scaler.scale));
  EXPECT_EQ(a.scaler, b.scaler);
  EXPECT_EQ(a.config_yaml, b.config_yaml);
}

// Runs `f`, expects an rn::Error, and returns its message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an rn::Error";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

// Copies safetensors file `src` to `dst`, changing its metadata and dropping or replacing tensors.
void rewrite(const std::string& src, const std::string& dst,
             const std::function<void(std::map<std::string, std::string>&)>& edit_metadata,
             const std::string& drop = "", const std::pair<std::string, Tensor>* replace = nullptr) {
  SafetensorsFile f = SafetensorsFile::load(src);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& e : f.entries()) {
    if (e.name == drop) continue;
    if (replace != nullptr && e.name == replace->first) {
      tensors.push_back(*replace);
    } else {
      tensors.emplace_back(e.name, f.view(e.name));
    }
  }
  std::map<std::string, std::string> md = f.metadata();
  edit_metadata(md);
  write_safetensors(dst, tensors, md);
}

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A safetensors file from another writer (the torchvision converter), which may hold I64 tensors.
void write_raw(const std::string& path, const std::vector<RawTensor>& tensors,
               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian host
  out << text << data;
}

// The tensors of `m` as the torchvision converter writes them.
std::vector<RawTensor> raw_tensors(const Model& m) {
  std::vector<RawTensor> out;
  for (const std::string& n : m.names()) {
    Tensor t = m.named(n);
    RawTensor r{n, "F32", {}, std::string(static_cast<const char*>(t.data), t.bytes())};
    for (int i = 0; i < t.shape.rank(); ++i) r.shape.push_back(t.shape[i]);
    out.push_back(std::move(r));
  }
  return out;
}

void truncate_file(const std::string& path, uint64_t size) { fs::resize_file(path, size); }

// ------------------------------------------------------------------------------------------------

TEST(Checkpoint, RoundTripIsBitwise) {
  TestDir dir;
  const std::string path = dir.file("a.safetensors");
  Model a = make_model("resnet20", 1);
  fill_random(a, 11);
  Optimizer opt_a(OptimizerConfig{}, a.params());
  fill_momentum(a, opt_a, 12);
  const TrainState st = odd_state();
  save_checkpoint(path, a, opt_a, st);

  Model b = make_model("resnet20", 2);
  Optimizer opt_b(OptimizerConfig{}, b.params());
  const TrainState back = load_checkpoint(path, b, &opt_b);
  expect_same_state(back, st);
  EXPECT_TRUE(differing(a, b).empty());
  EXPECT_EQ(std::memcmp(a.param_data(), b.param_data(), static_cast<size_t>(a.params().total) * 4), 0);
  ASSERT_EQ(opt_a.state().size(), opt_b.state().size());
  EXPECT_EQ(std::memcmp(opt_a.state().data(), opt_b.state().data(), opt_a.state().size() * 4), 0);

  // The file: torchvision names, per-parameter momentum, the version, the model.
  SafetensorsFile f = SafetensorsFile::load(path);
  EXPECT_EQ(f.entries().size(), a.names().size() + a.params().params.size());
  ASSERT_NE(f.find("conv1.weight"), nullptr);
  ASSERT_NE(f.find("bn1.running_var"), nullptr);
  ASSERT_NE(f.find("optimizer.momentum.fc.weight"), nullptr);
  EXPECT_EQ(f.find("optimizer.momentum.fc.weight")->shape, (Shape{10, 64}));
  EXPECT_EQ(f.metadata().at("resnet_cpp.kind"), "checkpoint");
  EXPECT_EQ(f.metadata().at("resnet_cpp.version"), "1");
  EXPECT_EQ(f.metadata().at("model"), "resnet20");
  EXPECT_EQ(f.metadata().at("train.best_top1"), "0.30000000000000004");
  EXPECT_EQ(f.metadata().at("train.rng"), "0 1 18446744073709551615 9223372036854775809");
}

TEST(Checkpoint, LoadOverwritesEveryTensor) {
  TestDir dir;
  const std::string path = dir.file("a.safetensors");
  Model a = make_model("resnet20", 1);
  fill_random(a, 21);
  Optimizer opt_a(OptimizerConfig{}, a.params());
  save_checkpoint(path, a, opt_a, TrainState{});

  Model b = make_model("resnet20", 3);
  fill_random(b, 22);
  ASSERT_EQ(differing(a, b).size(), a.names().size());  // every tensor differs before
  load_checkpoint(path, b, nullptr);                    // without an optimizer: momentum skipped
  EXPECT_TRUE(differing(a, b).empty());
}

TEST(Checkpoint, DamagedFileErrorNamesTheFile) {
  TestDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Model a = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, a.params());
  save_checkpoint(path, a, opt, TrainState{});
  const uint64_t size = fs::file_size(path);

  Model b = make_model("resnet20", 5);
  Model b_before = make_model("resnet20", 5);
  for (uint64_t cut : {size - 4, size / 2, uint64_t{100}, uint64_t{4}, uint64_t{0}}) {
    fs::copy_file(path, dir.file("cut.safetensors"), fs::copy_options::overwrite_existing);
    truncate_file(dir.file("cut.safetensors"), cut);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("cut.safetensors"), b, &opt); }), "cut.safetensors");
  }
  {
    std::ofstream(dir.file("garbage.safetensors"), std::ios::binary) << std::string(4096, '\x7f');
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("garbage.safetensors"), b, &opt); }),
                    "garbage.safetensors");
  }
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("missing.safetensors"), b, &opt); }), "missing.safetensors");
  EXPECT_TRUE(differing(b, b_before).empty());  // nothing was written into the model
}

TEST(Checkpoint, MetadataErrorsNameTheField) {
  TestDir dir;
  const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
  Model a = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, a.params());
  save_checkpoint(good, a, opt, odd_state());
  Model b = make_model("resnet20", 9);
  const Model b_before = make_model("resnet20", 9);

  auto load_bad = [&](const std::function<void(std::map<std::string, std::string>&)>& edit) {
    rewrite(good, bad, edit);
    return error_of([&] { load_checkpoint(bad, b, &opt); });
  };
  std::string e = load_bad([](auto& md) { md.erase("train.step"); });
  EXPECT_CONTAINS(e, "'train.step' is missing");
  EXPECT_CONTAINS(e, "bad.safetensors");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["scaler.scale"] = "1.5x"; }), "'scaler.scale' = '1.5x' is not a number");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["train.epoch"] = "-"; }), "'train.epoch'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["train.batch_in_epoch"] = "99999999999999999999"; }),
                  "'train.batch_in_epoch'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["train.rng"] = "1 2 3"; }), "'train.rng'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["train.rng"] = "1 2 3 -4"; }), "'train.rng'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md.erase("config_yaml"); }), "'config_yaml'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["resnet_cpp.version"] = "2"; }), "newer resnet.cpp");
  EXPECT_CONTAINS(load_bad([](auto& md) { md["resnet_cpp.version"] = "one"; }), "'resnet_cpp.version'");
  EXPECT_CONTAINS(load_bad([](auto& md) { md.erase("resnet_cpp.kind"); }), "is not a resnet.cpp checkpoint");
  EXPECT_TRUE(differing(b, b_before).empty());  // every failure left the model untouched
}

TEST(Checkpoint, MissingMomentumAndWrongDtypeNameTheTensor) {
  TestDir dir;
  const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
  Model a = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, a.params());
  fill_momentum(a, opt, 3);
  save_checkpoint(good, a, opt, TrainState{});
  const std::vector<float> momentum_before = opt.state();
  const auto same_metadata = [](std::map<std::string, std::string>&) {};

  rewrite(good, bad, same_metadata, "optimizer.momentum.fc.weight");
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(bad, a, &opt); }), "'optimizer.momentum.fc.weight'");
  EXPECT_EQ(opt.state(), momentum_before);
  load_checkpoint(bad, a, nullptr);  // weights only: the momentum is not needed

  rewrite(good, bad, same_metadata, "layer2.0.bn1.running_mean");
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(bad, a, &opt); }), "missing tensor(s): 'layer2.0.bn1.running_mean'");

  HostTensor half(Shape{10}, DType::f16);
  const std::pair<std::string, Tensor> replacement{"fc.bias", half.view()};
  rewrite(good, bad, same_metadata, "", &replacement);
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(bad, a, &opt); }), "tensor 'fc.bias' is F16, expected F32");
}

TEST(Checkpoint, WrongModelErrorNamesTheTensor) {
  TestDir dir;
  Model r32 = make_model("resnet32", 1);
  Optimizer opt32(OptimizerConfig{}, r32.params());
  save_checkpoint(dir.file("r32.safetensors"), r32, opt32, TrainState{});
  Model r20 = make_model("resnet20", 1);
  Optimizer opt20(OptimizerConfig{}, r20.params());
  save_checkpoint(dir.file("r20.safetensors"), r20, opt20, TrainState{});

  std::string e = error_of([&] { load_checkpoint(dir.file("r32.safetensors"), r20, &opt20); });
  EXPECT_CONTAINS(e, "unknown tensor(s): 'layer1.3.");
  EXPECT_CONTAINS(e, "does not fit model 'resnet20'");
  EXPECT_CONTAINS(e, "written for model 'resnet32'");
  EXPECT_CONTAINS(error_of([&] { load_weights(dir.file("r32.safetensors"), r20); }), "'layer1.3.");

  e = error_of([&] { load_checkpoint(dir.file("r20.safetensors"), r32, &opt32); });
  EXPECT_CONTAINS(e, "missing tensor(s): 'layer1.3.");

  Model wide = make_model("resnet20", 1, 100);
  e = error_of([&] { load_weights(dir.file("r20.safetensors"), wide); });
  EXPECT_CONTAINS(e, "tensor 'fc.weight' has shape [10, 64] in the file, the model's is [100, 64]");
  EXPECT_CONTAINS(e, "'fc.bias'");
}

TEST(Weights, SaveLoadAndCheckpointInterop) {
  TestDir dir;
  Model a = make_model("resnet20", 1);
  fill_random(a, 31);
  save_weights(dir.file("w.safetensors"), a);
  SafetensorsFile f = SafetensorsFile::load(dir.file("w.safetensors"));
  EXPECT_EQ(f.entries().size(), a.names().size());  // params and running stats, nothing else
  EXPECT_EQ(f.metadata().at("resnet_cpp.kind"), "weights");
  EXPECT_EQ(f.metadata().at("format"), "pt");

  Model b = make_model("resnet20", 2);
  load_weights(dir.file("w.safetensors"), b);
  EXPECT_TRUE(differing(a, b).empty());

  // A checkpoint loads as weights; a weights file does not load as a checkpoint.
  Optimizer opt(OptimizerConfig{}, a.params());
  save_checkpoint(dir.file("c.safetensors"), a, opt, TrainState{});
  Model c = make_model("resnet20", 3);
  load_weights(dir.file("c.safetensors"), c);
  EXPECT_TRUE(differing(a, c).empty());
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("w.safetensors"), c, &opt); }),
                  "is a resnet.cpp weights file, not a checkpoint");
}

TEST(Weights, PlainConverterFile) {
  TestDir dir;
  Model a = make_model("resnet20", 1);
  fill_random(a, 41);
  const std::map<std::string, std::string> md = {{"format", "pt"}, {"model", "resnet20"}};
  std::vector<RawTensor> tensors = raw_tensors(a);
  // torchvision's int64 BN counters (--keep-num-batches-tracked) are accepted and ignored.
  tensors.push_back({"bn1.num_batches_tracked", "I64", {}, std::string(8, '\0')});
  write_raw(dir.file("tv.safetensors"), tensors, md);
  Model b = make_model("resnet20", 2);
  load_weights(dir.file("tv.safetensors"), b);
  EXPECT_TRUE(differing(a, b).empty());
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("tv.safetensors"), b, nullptr); }),
                  "is not a resnet.cpp checkpoint");

  // Missing running stats are an error; so is a counter of a BN the model lacks, or any stray tensor.
  std::vector<RawTensor> no_stats;
  for (const RawTensor& t : raw_tensors(a))
    if (t.name != "layer3.2.bn2.running_var") no_stats.push_back(t);
  write_raw(dir.file("nostats.safetensors"), no_stats, md);
  EXPECT_CONTAINS(error_of([&] { load_weights(dir.file("nostats.safetensors"), b); }),
                  "missing tensor(s): 'layer3.2.bn2.running_var'");
  tensors.push_back({"layer9.0.bn1.num_batches_tracked", "I64", {}, std::string(8, '\0')});
  write_raw(dir.file("stray.safetensors"), tensors, md);
  EXPECT_CONTAINS(error_of([&] { load_weights(dir.file("stray.safetensors"), b); }),
                  "unknown tensor(s): 'layer9.0.bn1.num_batches_tracked'");
}

// ------------------------------------------------------------------------------------------------

// Saves with fc.bias[0] = step, so each file's weights are recognisable.
std::string save_at(CheckpointManager& m, Model& model, const Optimizer& opt, int64_t step, std::optional<double> top1,
                    double best_top1 = -1) {
  model.named("fc.bias").ptr<float>()[0] = static_cast<float>(step);
  TrainState st;
  st.step = step;
  st.best_top1 = best_top1;
  return m.save(model, opt, st, /*is_epoch_end=*/top1.has_value(), top1);
}

std::vector<std::string> file_names(const std::string& folder) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(folder)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointManager, RotationKeepsLastAndBest) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  CheckpointManager m(dir.path().string(), 2, true);
  EXPECT_EQ(save_at(m, model, opt, 10, 0.5), dir.file("checkpoints/step-00000010.safetensors"));
  save_at(m, model, opt, 20, 0.7);
  save_at(m, model, opt, 30, 0.6);
  save_at(m, model, opt, 35, std::nullopt);  // a periodic save, no evaluation
  save_at(m, model, opt, 40, 0.65);
  EXPECT_EQ(file_names(m.dir()),
            (std::vector<std::string>{"best.safetensors", "step-00000035.safetensors", "step-00000040.safetensors"}));

  // best.safetensors is step 20's checkpoint, though step-20 itself has been rotated away.
  Model back = make_model("resnet20", 2);
  TrainState st = load_checkpoint(m.best_path(), back, nullptr);
  EXPECT_EQ(st.step, 20);
  EXPECT_EQ(st.best_top1, 0.7);
  EXPECT_EQ(back.named("fc.bias").ptr<float>()[0], 20.0f);
  EXPECT_EQ(m.best_top1(), 0.7);
  // Every later checkpoint records the best so far, whatever the trainer passed.
  EXPECT_EQ(load_checkpoint(m.step_path(40), back, nullptr).best_top1, 0.7);

  save_at(m, model, opt, 50, 0.9);
  st = load_checkpoint(m.best_path(), back, nullptr);
  EXPECT_EQ(st.step, 50);
  EXPECT_EQ(back.named("fc.bias").ptr<float>()[0], 50.0f);
  EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{m.step_path(40), m.step_path(50)}));

  // A manager of a resumed run knows the best from best.safetensors: 0.8 does not replace 0.9.
  CheckpointManager resumed(dir.path().string(), 2, true);
  save_at(resumed, model, opt, 60, 0.8, /*best_top1=*/0.8);  // the trainer folded 0.8 in already
  EXPECT_EQ(load_checkpoint(resumed.best_path(), back, nullptr).step, 50);
  EXPECT_EQ(load_checkpoint(resumed.step_path(60), back, nullptr).best_top1, 0.9);
  save_at(resumed, model, opt, 70, 0.95, /*best_top1=*/0.95);
  EXPECT_EQ(load_checkpoint(resumed.best_path(), back, nullptr).step, 70);
  EXPECT_EQ(file_names(m.dir()),
            (std::vector<std::string>{"best.safetensors", "step-00000060.safetensors", "step-00000070.safetensors"}));
}

// A resumed run's best.safetensors is read whole before it counts as the best so far: one with a
// flipped data bit, or another model's copied in, would otherwise keep every later improvement
// below its recorded top-1 from being saved as the best.
TEST(CheckpointManager, ADamagedOrForeignBestIsNoBaseline) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  {
    CheckpointManager m(dir.path().string(), 0, true);
    save_at(m, model, opt, 10, 0.9);
  }
  CheckpointManager m(dir.path().string(), 0, true);
  ASSERT_EQ(m.best_top1(&model), 0.9);
  {
    std::fstream f(m.best_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(-1, std::ios::end);
    f.put(c);
  }
  EXPECT_EQ(m.best_top1(), 0.9) << "the header alone still reads";
  {
    LogCapture log;
    CheckpointManager resumed(dir.path().string(), 0, true);
    save_at(resumed, model, opt, 20, 0.5);
    EXPECT_CONTAINS(log.text(), "is damaged or not this run's");
    EXPECT_CONTAINS(log.text(), "the tensor data is damaged");
    EXPECT_EQ(load_checkpoint(resumed.best_path(), model, nullptr).step, 20);
  }

  // Another model's best, with a higher top-1, copied in.
  Model other = make_model("resnet32", 1);
  Optimizer other_opt(OptimizerConfig{}, other.params());
  CheckpointManager theirs(dir.file("other_run"), 0, true);
  save_at(theirs, other, other_opt, 5, 0.99);
  fs::remove(m.best_path());
  fs::copy_file(theirs.best_path(), m.best_path());
  LogCapture log;
  CheckpointManager resumed(dir.path().string(), 0, true);
  save_at(resumed, model, opt, 30, 0.4);
  EXPECT_CONTAINS(log.text(), "does not fit model 'resnet20'");
  EXPECT_EQ(load_checkpoint(resumed.best_path(), model, nullptr).step, 30);
}

TEST(CheckpointManager, KeepAllWithoutBest) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  CheckpointManager m(dir.path().string(), 0, false);
  for (int64_t s = 1; s <= 4; ++s) save_at(m, model, opt, s * 100, 0.1 * static_cast<double>(s));
  EXPECT_EQ(m.checkpoints().size(), 4u);
  EXPECT_FALSE(fs::exists(m.best_path()));
  EXPECT_EQ(m.latest(), m.step_path(400));
  EXPECT_THROW(CheckpointManager(dir.path().string(), -1, true), Error);
}

// A folder under a checkpoint's name was skipped without a word, and the run died steps later
// at the save that replaced it: it is named at once.
TEST(CheckpointManager, AFolderNamedLikeACheckpointIsNamedAtOnce) {
  for (const char* name : {"step-00000300.safetensors", "best.safetensors"}) {
    TestDir dir;
    CheckpointManager m(dir.path().string(), 2, true);
    fs::create_directories(dir.path() / "checkpoints" / name);
    try {
      m.checkpoints();
      ADD_FAILURE() << name << " was passed over";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string(name) + "' is named like a checkpoint but is not a file (a folder)"),
          std::string::npos)
          << e.what();
    }
  }
}

TEST(CheckpointManager, RewoundRunSetsLaterCheckpointsAside) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  CheckpointManager m(dir.path().string(), 1, false);
  save_at(m, model, opt, 300, std::nullopt);
  save_at(m, model, opt, 250, std::nullopt);  // resumed from an older checkpoint: 300 is another line
  EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{m.step_path(250)}));
  EXPECT_EQ(m.latest(), m.step_path(250));
  EXPECT_TRUE(fs::exists(m.step_path(300) + ".abandoned"));
  save_at(m, model, opt, 300, std::nullopt);
  EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{m.step_path(300)}));
}

TEST(CheckpointManager, LatestSkipsTruncatedFilesAndTemporaries) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  CheckpointManager m(dir.path().string(), 0, true);
  EXPECT_EQ(m.latest(), std::nullopt);  // no folder yet
  EXPECT_FALSE(m.latest_loadable(model, &opt).has_value());

  fill_momentum(model, opt, 7);
  save_at(m, model, opt, 10, std::nullopt);
  const std::vector<float> momentum_10 = opt.state();
  fill_momentum(model, opt, 8);
  save_at(m, model, opt, 20, std::nullopt);
  save_at(m, model, opt, 30, std::nullopt);
  truncate_file(m.step_path(30), fs::file_size(m.step_path(30)) - 100);  // the newest is torn
  fs::resize_file(m.step_path(20), 3);                                   // and so is the one before
  // Leftovers of a killed write, by both writers' naming schemes, and a file that is not ours to judge.
  std::ofstream(m.dir() + "/step-00000040.safetensors.tmp.4242.0") << "partial";
  std::ofstream(m.dir() + "/.step-00000050.safetensors.tmp.4242.1") << "partial";
  std::ofstream(m.dir() + "/notes.txt") << "keep me";

  EXPECT_EQ(m.latest(), m.step_path(10));
  EXPECT_EQ(file_names(m.dir()), (std::vector<std::string>{"notes.txt", "step-00000010.safetensors",
                                                           "step-00000020.safetensors", "step-00000030.safetensors"}));

  Model back = make_model("resnet20", 2);
  Optimizer opt_back(OptimizerConfig{}, back.params());
  auto loaded = m.latest_loadable(back, &opt_back);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->path, m.step_path(10));
  EXPECT_EQ(loaded->state.step, 10);
  EXPECT_EQ(back.named("fc.bias").ptr<float>()[0], 10.0f);
  EXPECT_EQ(opt_back.state(), momentum_10);
}

TEST(CheckpointManager, DamagedFilesAreSetAsideAndLeaveTheRotation) {
  TestDir dir;
  Model model = make_model("resnet20", 1);
  Optimizer opt(OptimizerConfig{}, model.params());
  CheckpointManager m(dir.path().string(), 2, false);
  save_at(m, model, opt, 10, std::nullopt);
  save_at(m, model, opt, 20, std::nullopt);
  fs::resize_file(m.step_path(20), 100000);  // torn

  auto loaded = m.latest_loadable(model, &opt, /*set_aside_damaged=*/true);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->state.step, 10);
  EXPECT_EQ(m.set_aside(), (std::vector<std::string>{m.step_path(20) + ".damaged"}));
  // The resumed run saves step 30: it keeps the good step 10 with it, as keep_last 2 says.
  // Left under its name, the torn step 20 would have been kept and step 10 deleted.
  save_at(m, model, opt, 30, std::nullopt);
  EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{m.step_path(10), m.step_path(30)}));

  // Without set_aside_damaged (a rank that does not write the folder) the file stays.
  fs::resize_file(m.step_path(30), 100);
  loaded = m.latest_loadable(model, &opt);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->state.step, 10);
  EXPECT_TRUE(fs::exists(m.step_path(30)));
}

TEST(CheckpointManager, LatestLoadableThrowsOnWrongModel) {
  TestDir dir;
  Model r32 = make_model("resnet32", 1);
  Optimizer opt32(OptimizerConfig{}, r32.params());
  CheckpointManager m(dir.path().string(), 0, false);
  save_at(m, r32, opt32, 10, std::nullopt);
  Model r20 = make_model("resnet20", 1);
  Optimizer opt20(OptimizerConfig{}, r20.params());
  EXPECT_CONTAINS(error_of([&] { m.latest_loadable(r20, &opt20); }), "'layer1.3.");
}

}  // namespace
}  // namespace rn

// Starting from weights trained elsewhere (train/pretrained.h, model.pretrained, resnet import):
// torchvision's own state dict, saved by PyTorch in either container and in fp16, loads to
// exactly what the Python converter writes; excluded tensors keep their initialisation; a
// file that does not fit is refused before anything is written; and a training run started
// from a file follows the run that started from the same weights by itself.
#include "train/pretrained.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "log_capture.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "python_for_tests.h"
#include "small_run.h"
#include "test_dir.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace rn {
namespace {

namespace fs = std::filesystem;

using test::python;

Model make(const std::string& name, int64_t classes, int64_t channels, int64_t size, uint64_t seed) {
  ModelOptions o;
  o.num_classes = classes;
  o.in_channels = channels;
  o.height = o.width = size;
  Model m(build_model(name, o));
  m.init(seed);
  return m;
}

std::map<std::string, std::vector<float>> values(const Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (const std::string& n : m.names()) {
    const Tensor t = m.named(n);
    out[n].assign(t.ptr<float>(), t.ptr<float>() + t.numel());
  }
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Pretrained, TorchvisionStateDictLoadsAsTheConverterWritesIt) {
  TestDir dir;
  // torchvision's resnet18 (random, seed 0): its state dict in both containers and in fp16, and
  // the Python converter's safetensors file of the same weights.
  const std::string script =
      "import torch, torchvision\n"
      "torch.manual_seed(0)\n"
      "sd = torchvision.models.resnet18().state_dict()\n"
      "torch.save(sd, 'zip.pth')\n"
      "torch.save(sd, 'legacy.pth', _use_new_zipfile_serialization=False)\n"
      "torch.save({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, "
      "'half.pth')\n";
  const std::string cmd =
      "cd " + dir.path().string() + " && " + python() + " -c \"" + script + "\" > make.log 2>&1 && " + python() + " " +
      RN_SOURCE_DIR +
      "/tools/torchvision_to_safetensors.py --model resnet18 --weights zip.pth --out conv.safetensors"
      " >> make.log 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "torch/torchvision not usable by " << python() << ": " << cmd;
  const SafetensorsFile conv = SafetensorsFile::load(dir.file("conv.safetensors"));
  for (const char* file : {"zip.pth", "legacy.pth", "half.pth", "conv.safetensors"}) {
    const auto tv = torchvision_resnet_in(dir.file(file));
    ASSERT_TRUE(tv) << file;
    EXPECT_EQ(tv->name, "resnet18") << file;
    EXPECT_EQ(tv->num_classes, 1000) << file;
  }
  for (const char* file : {"zip.pth", "legacy.pth", "half.pth"}) {
    SCOPED_TRACE(file);
    Model m = make("resnet18", 1000, 3, 224, 5);
    const PretrainedLoad r = load_pretrained(dir.file(file), m);
    EXPECT_EQ(r.loaded, 102);
    EXPECT_EQ(r.ignored, 20);  // the BN counters
    EXPECT_EQ(r.format, std::string(file) == "legacy.pth" ? "PyTorch legacy" : "PyTorch zip");
    const bool half = std::string(file) == "half.pth";
    EXPECT_EQ(r.converted, half ? std::vector<std::string>{"F16"} : std::vector<std::string>{});
    int64_t differ = 0;
    for (const std::string& n : m.names()) {
      const Tensor want = conv.view(n);
      const Tensor got = m.named(n);
      ASSERT_EQ(want.numel(), got.numel()) << n;
      for (int64_t i = 0; i < got.numel(); ++i) {
        float w = want.ptr<float>()[i];
        if (half) w = f16_to_f32(f32_to_f16(w));
        if (std::memcmp(&w, got.ptr<float>() + i, 4) != 0) ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << "values differ from the converter's";
  }
}

// torchvision's ResNets are told apart by their tensors alone (our models carry torchvision's
// names and shapes); anything else, including our hardware-adapted variant, is not guessed at.
TEST(Pretrained, TorchvisionResnetsAreRecognisedByTheirTensors) {
  auto shapes_of = [](const std::string& name, int64_t classes, bool module_prefix) {
    ModelOptions o;
    o.num_classes = classes;
    o.in_channels = 3;
    o.height = o.width = 224;
    const Model m(build_model(name, o));
    TensorShapes shapes;
    for (const std::string& n : m.names()) {
      const Tensor t = m.named(n);
      std::vector<int64_t> dims;
      for (int d = 0; d < t.shape.rank(); ++d) dims.push_back(t.shape[d]);
      shapes.emplace_back(module_prefix ? "module." + n : n, dims);
    }
    return shapes;
  };
  for (const char* name : {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}) {
    const auto tv = torchvision_resnet_of(shapes_of(name, 1000, false));
    ASSERT_TRUE(tv) << name;
    EXPECT_EQ(tv->name, name);
    EXPECT_EQ(tv->num_classes, 1000);
  }
  const auto five = torchvision_resnet_of(shapes_of("resnet50", 5, true));
  ASSERT_TRUE(five);
  EXPECT_EQ(five->name, "resnet50");
  EXPECT_EQ(five->num_classes, 5);
  EXPECT_FALSE(torchvision_resnet_of(shapes_of("resnet50_gdw", 1000, false))) << "a deep stem is not torchvision's";
  EXPECT_FALSE(torchvision_resnet_of(shapes_of("resnet20", 10, false)));
  EXPECT_FALSE(torchvision_resnet_of({}));
  // One block fewer in a stage is no torchvision network.
  TensorShapes cut;
  for (auto& t : shapes_of("resnet18", 1000, false))
    if (t.first.rfind("layer3.1.", 0) != 0) cut.push_back(t);
  EXPECT_FALSE(torchvision_resnet_of(cut));
}

TEST(Pretrained, ExcludedTensorsKeepTheirInitialisation) {
  TestDir dir;
  const Model source = make("resnet20", 10, 1, 28, 1);
  save_weights(dir.file("w.safetensors"), source);
  Model m = make("resnet20", 5, 1, 28, 2);  // a new classifier: 5 classes
  const auto before = values(m);
  const PretrainedLoad r = load_pretrained(dir.file("w.safetensors"), m, {"fc"});
  EXPECT_EQ(r.excluded, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(r.ignored, 2);
  const auto src = values(source), after = values(m);
  for (const auto& [n, v] : after) {
    if (n.rfind("fc.", 0) == 0)
      EXPECT_EQ(v, before.at(n)) << n << " was excluded but changed";
    else
      EXPECT_EQ(v, src.at(n)) << n << " was not loaded";
  }
  EXPECT_NE(r.summary().find("kept as initialised: fc.weight, fc.bias"), std::string::npos) << r.summary();
}

TEST(Pretrained, FileThatDoesNotFitIsRefusedBeforeAnythingIsWritten) {
  TestDir dir;
  save_weights(dir.file("w.safetensors"), make("resnet20", 10, 1, 28, 1));
  Model m = make("resnet20", 5, 1, 28, 2);
  const auto before = values(m);
  const std::string e = error_of([&] { load_pretrained(dir.file("w.safetensors"), m); });
  EXPECT_NE(e.find("does not fit resnet20"), std::string::npos) << e;
  EXPECT_NE(e.find("'fc.weight' has shape [10, 64] in the file, the model's is [5, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("model.pretrained_exclude=[fc]"), std::string::npos) << e;
  EXPECT_TRUE(values(m) == before) << "a refused load changed the model";
  // Another model altogether: its tensors are named both ways.
  Model other = make("resnet32", 10, 1, 28, 2);
  const std::string e2 = error_of([&] { load_pretrained(dir.file("w.safetensors"), other); });
  EXPECT_NE(e2.find("tensor(s) of the model missing"), std::string::npos) << e2;
  EXPECT_NE(e2.find("the file was written for resnet20"), std::string::npos) << e2;
}

TEST(Pretrained, ExcludeThatNamesNothingIsAnError) {
  TestDir dir;
  save_weights(dir.file("w.safetensors"), make("resnet20", 10, 1, 28, 1));
  Model m = make("resnet20", 10, 1, 28, 2);
  // "fcc" is a typo, and "f" only a prefix of a name, not one at a dot.
  for (const char* bad : {"fcc", "f"}) {
    const std::string e = error_of([&] { load_pretrained(dir.file("w.safetensors"), m, {bad}); });
    EXPECT_NE(e.find(std::string("model.pretrained_exclude: '") + bad + "' names no tensor of resnet20"),
              std::string::npos)
        << e;
  }
}

// One epoch of the shared small run (2 steps) is enough to tell two starts apart.
Config small_config(const std::string& out_dir) {
  Config c = test::small_run_config(out_dir);
  c.data.train_subset = 16;
  c.schedule.epochs = 1;
  c.schedule.warmup_epochs = 0;
  c.validate();
  return c;
}

std::map<std::string, std::vector<float>> run_weights(const Config& cfg, const std::string& run_dir) {
  Model m(build_model(cfg.model.name, model_options(cfg.model)));
  CheckpointManager cm(run_dir, 0, false);
  auto latest = cm.latest();
  EXPECT_TRUE(latest.has_value()) << run_dir;
  if (latest) load_weights(*latest, m);
  return values(m);
}

TEST(Pretrained, TrainingFromTheFileFollowsTrainingFromTheSameWeights) {
  TestDir dir;
  // Run A starts from its own initialisation (seed 42). The file holds that initialisation.
  const Config a_cfg = small_config((dir.path() / "a").string());
  Model init(build_model(a_cfg.model.name, model_options(a_cfg.model)));
  init.init(static_cast<uint64_t>(a_cfg.run.seed));
  save_weights(dir.file("init.safetensors"), init);
  const TrainResult a = train(a_cfg);
  // Run B would start with every residual branch's last BN gamma at 0; the file overrides that,
  // so B must end where A ends, bit for bit.
  Config b_cfg = small_config((dir.path() / "b").string());
  b_cfg.model.zero_init_residual = true;
  b_cfg.model.pretrained = dir.file("init.safetensors");
  const TrainResult b = train(b_cfg);
  ASSERT_EQ(a.steps, b.steps);
  EXPECT_TRUE(run_weights(a_cfg, a.run_dir) == run_weights(b_cfg, b.run_dir))
      << "training from model.pretrained did not start from the file's weights";
  // Without the file, the zero-initialised branches give other weights (the check can fail).
  Config c_cfg = small_config((dir.path() / "c").string());
  c_cfg.model.zero_init_residual = true;
  const TrainResult c = train(c_cfg);
  EXPECT_FALSE(run_weights(a_cfg, a.run_dir) == run_weights(c_cfg, c.run_dir));
}

// Weights whose BN running variance is negative make every evaluated output of that channel NaN.
// resnet eval and import warned of them; training from them as model.pretrained did not.
TEST(Pretrained, ANegativeRunningVarianceInTheFileIsWarnedAboutWhenTrainingStarts) {
  TestDir dir;
  Config cfg = small_config((dir.path() / "run").string());
  Model init(build_model(cfg.model.name, model_options(cfg.model)));
  init.init(static_cast<uint64_t>(cfg.run.seed));
  const std::string bn = "layer2.1.bn1.running_var";
  const std::vector<std::string> names = init.names();
  ASSERT_TRUE(std::find(names.begin(), names.end(), bn) != names.end());
  init.named(bn).ptr<float>()[3] = -0.5f;
  save_weights(dir.file("init.safetensors"), init);
  cfg.model.pretrained = dir.file("init.safetensors");
  LogCapture log;
  test::train_until(cfg, 1);
  EXPECT_NE(log.text().find("negative batch-norm running variances: '" + bn + "' (1 of"), std::string::npos)
      << log.text();
  EXPECT_NE(log.text().find("model.pretrained " + cfg.model.pretrained), std::string::npos) << log.text();
}

// An empty file (a download cut short) is named by what its name says it was meant to be: a
// .pth by the PyTorch reader, not as a safetensors file too short for its header.
TEST(Pretrained, AnEmptyFileIsNamedAsTheKindItsNameSays) {
  TestDir dir;
  Model m(build_model("resnet20", {}));
  for (const char* name : {"w.pth", "w.pt", "w.safetensors"}) std::ofstream(dir.file(name)).close();
  for (const char* name : {"w.pth", "w.pt"}) {
    const std::string e = error_of([&] { load_pretrained(dir.file(name), m); });
    EXPECT_NE(e.find("PyTorch file '" + dir.file(name) + "': it is empty (0 bytes)"), std::string::npos) << e;
  }
  const std::string e = error_of([&] { load_pretrained(dir.file("w.safetensors"), m); });
  EXPECT_NE(e.find("safetensors file '" + dir.file("w.safetensors") + "': file too short (0 bytes)"), std::string::npos)
      << e;
}

TEST(Pretrained, ConfigKeysParseAndCheck) {
  const Config c = load_config_from_string("model:\n  pretrained: w.pth\n  pretrained_exclude: [fc, layer4]\n");
  EXPECT_EQ(c.model.pretrained, "w.pth");
  EXPECT_EQ(c.model.pretrained_exclude, (std::vector<std::string>{"fc", "layer4"}));
  EXPECT_EQ(
      load_config_from_string("", {"model.pretrained=w.pth", "model.pretrained_exclude=fc"}).model.pretrained_exclude,
      (std::vector<std::string>{"fc"}));
  EXPECT_THROW(load_config_from_string("model:\n  pretrained: w.pth\n  pretrained_exclude: {a: 1}\n"), Error);
  // Excluding from nothing is a mistake in the config.
  EXPECT_THROW(load_config_from_string("", {"model.pretrained_exclude=fc"}), Error);
  // Written back and read again, unchanged.
  EXPECT_EQ(load_config_from_string(c.to_yaml()).model, c.model);
}

// Every recipe in configs/ loads and passes validation, given what its header says the user
// supplies; the fine-tuning recipe without its weights names what is missing.
TEST(Recipes, EveryRecipeLoads) {
  const std::map<std::string, std::vector<std::string>> user_sets = {
      {"finetune_resnet50.yaml", {"model.pretrained=resnet50-0676ba61.pth", "model.num_classes=5"}}};
  int n = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(RN_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    auto it = user_sets.find(name);
    EXPECT_NO_THROW(load_config(entry.path().string(), it == user_sets.end() ? std::vector<std::string>{} : it->second))
        << name;
    ++n;
  }
  EXPECT_GE(n, 4);
  const std::string e = error_of([] { load_config(std::string(RN_SOURCE_DIR) + "/configs/finetune_resnet50.yaml"); });
  EXPECT_NE(e.find("model.pretrained, which is not set"), std::string::npos) << e;
}

}  // namespace
}  // namespace rn

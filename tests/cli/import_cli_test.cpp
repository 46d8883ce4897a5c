// `resnet import` and `model.pretrained` through the real binary: torchvision's resnet18 state
// dict, saved by PyTorch, becomes a weights file that carries its config; a pickled module and a
// file that does not fit are refused with the file named, and nothing is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "model/model.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "python_for_tests.h"
#include "resnet_process.h"

namespace rn {
namespace {

namespace fs = std::filesystem;
using test::read_all;
using test::spawn;
using test::wait_for;

using test::python;

class ImportCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(RN_BINARY_DIR) / "test_runs" / "import_cli" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string script =
        "import torch, torchvision\n"
        "torch.manual_seed(0)\n"
        "m = torchvision.models.resnet18()\n"
        "torch.save(m.state_dict(), 'r18.pth')\n"
        "torch.save(m, 'module.pth')\n"
        "torch.save(torchvision.models.resnet18(num_classes=5).state_dict(), 'r18_5.pth')\n"
        "torch.save(torchvision.models.resnet18(num_classes=1).state_dict(), 'r18_1.pth')\n"
        "sd = torchvision.models.resnet18(num_classes=5).state_dict()\n"
        "sd['fc.weight'][0, 0] = float('nan')\n"
        "torch.save(sd, 'r18_nan.pth')\n"
        "torch.save({'w': torch.zeros(2)}, 'other.pth')\n";
    const std::string cmd = "cd " + dir_.string() + " && " + python() + " -c \"" + script + "\" > make.log 2>&1";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "torch/torchvision not usable by " << python();
  }
  int resnet(const std::vector<std::string>& args) { return wait_for(spawn(args, dir_ / "log.txt")); }
  std::string log() const { return read_all(dir_ / "log.txt"); }
  fs::path dir_;
};

TEST_F(ImportCli, TorchvisionStateDictBecomesAWeightsFileWithItsConfig) {
  const fs::path out = dir_ / "r18.safetensors";
  ASSERT_EQ(resnet({"import", (dir_ / "r18.pth").string(), "--model", "resnet18", "--out", out.string()}), 0) << log();
  EXPECT_NE(log().find("resnet18, 102 tensors from a PyTorch zip file; 20 tensor(s) not needed"), std::string::npos)
      << log();
  const SafetensorsFile f = SafetensorsFile::load(out.string());
  EXPECT_EQ(f.entries().size(), 102u);
  EXPECT_EQ(f.metadata().at("model"), "resnet18");
  const std::string& yaml = f.metadata().at("config_yaml");
  EXPECT_NE(yaml.find("num_classes: 1000"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("in_channels: 3"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("dataset: imagefolder"), std::string::npos) << yaml;
  // The embedded config is what `resnet export` uses: no --set needed to describe the model.
  ASSERT_EQ(resnet({"export", "--weights", out.string(), "--out", (dir_ / "again.safetensors").string()}), 0) << log();
  // Export (and eval) also take the .pth itself, recognised by its tensors: the same bytes.
  const fs::path direct = dir_ / "direct.safetensors";
  ASSERT_EQ(resnet({"export", "--weights", (dir_ / "r18.pth").string(), "--out", direct.string()}), 0) << log();
  EXPECT_NE(log().find("its tensors are torchvision's resnet18 with 1000 classes"), std::string::npos) << log();
  // Evaluating weights from elsewhere needs the images: said so, not a default dataset's error.
  EXPECT_EQ(resnet({"eval", "--weights", (dir_ / "r18.pth").string()}), 1);
  EXPECT_NE(log().find("records no dataset (weights from elsewhere): give the images to evaluate with --data DIR"),
            std::string::npos)
      << log();
  // So does the imported file, whose config records no data folder (it recorded the built-in
  // Fashion-MNIST folder, and eval failed on that folder's lack of class folders).
  EXPECT_EQ(yaml.find("fashion-mnist"), std::string::npos) << yaml;
  EXPECT_EQ(resnet({"eval", "--weights", out.string()}), 1);
  EXPECT_NE(log().find("records no dataset (weights from elsewhere): give the images to evaluate with --data DIR"),
            std::string::npos)
      << log();
  const SafetensorsFile d = SafetensorsFile::load(direct.string());
  ASSERT_EQ(d.entries().size(), f.entries().size());
  for (const SafetensorsEntry& e : f.entries()) {
    const auto a = f.raw(e.name), b = d.raw(e.name);
    EXPECT_TRUE(a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin())) << e.name;
  }
}

// Without --model, a torchvision ResNet is recognised by its tensors, with its own classifier:
// a model fine-tuned to 5 classes imports as 5 classes, with or without --model.
TEST_F(ImportCli, TorchvisionResnetsAreRecognisedWithTheirClasses) {
  for (const bool named : {false, true}) {
    SCOPED_TRACE(named ? "--model resnet18" : "no --model");
    const fs::path out = dir_ / (named ? "named.safetensors" : "r18_5.safetensors");
    std::vector<std::string> args = {"import", (dir_ / "r18_5.pth").string(), "--out", out.string()};
    if (named) args.insert(args.end(), {"--model", "resnet18"});
    ASSERT_EQ(resnet(args), 0) << log();
    if (!named) {
      EXPECT_NE(log().find("torchvision's resnet18 with 5 classes, by its tensors"), std::string::npos) << log();
    }
    const std::string yaml = SafetensorsFile::load(out.string()).metadata().at("config_yaml");
    EXPECT_NE(yaml.find("num_classes: 5"), std::string::npos) << yaml;
    EXPECT_NE(yaml.find("image_size: [224, 224]"), std::string::npos) << yaml;
  }
  // Our own weights file imports as its embedded config describes it (5 classes), not as
  // torchvision's 1000-class setting or the built-in resnet20 recipe.
  const fs::path again = dir_ / "again.safetensors";
  ASSERT_EQ(resnet({"import", (dir_ / "r18_5.safetensors").string(), "--out", again.string()}), 0) << log();
  EXPECT_NE(log().find("resnet18 as its embedded config describes it"), std::string::npos) << log();
  EXPECT_NE(SafetensorsFile::load(again.string()).metadata().at("config_yaml").find("num_classes: 5"),
            std::string::npos);
  // A one-output classifier is named as such, not as a model.num_classes=1 the user never set.
  EXPECT_EQ(resnet({"import", (dir_ / "r18_1.pth").string(), "--out", (dir_ / "one.safetensors").string()}), 1);
  EXPECT_NE(log().find("r18_1.pth holds a resnet18 whose classifier has 1 output"), std::string::npos) << log();
  EXPECT_EQ(log().find("--set model.num_classes"), std::string::npos) << log();
  // Weights holding a NaN import (they are what the file holds), with a warning naming them.
  ASSERT_EQ(resnet({"import", (dir_ / "r18_nan.pth").string(), "--out", (dir_ / "nan.safetensors").string()}), 0)
      << log();
  EXPECT_NE(log().find("1 tensor holds values that are not finite (NaN or infinity): 'fc.weight' (1 of 2560 values)"),
            std::string::npos)
      << log();
}

TEST_F(ImportCli, PickledModuleAndMisfitAreRefusedWithNothingWritten) {
  const fs::path out = dir_ / "x.safetensors";
  EXPECT_EQ(resnet({"import", (dir_ / "module.pth").string(), "--model", "resnet18", "--out", out.string()}), 1);
  EXPECT_NE(log().find("holds a pickled module (torchvision.models.resnet.ResNet), not a state dict"),
            std::string::npos)
      << log();
  EXPECT_EQ(resnet({"import", (dir_ / "r18.pth").string(), "--model", "resnet34", "--out", out.string()}), 1);
  EXPECT_NE(log().find("r18.pth' does not fit resnet34"), std::string::npos) << log();
  // Another architecture: the file is named for what it is, and no classifier advice.
  EXPECT_NE(log().find("its tensors are torchvision's resnet18 with 1000 classes"), std::string::npos) << log();
  EXPECT_EQ(log().find("pretrained_exclude"), std::string::npos) << log();
  // A missing file is named as missing, whatever its extension suggests.
  EXPECT_EQ(resnet({"import", (dir_ / "nope.pth").string(), "--out", out.string()}), 1);
  EXPECT_NE(log().find("'" + (dir_ / "nope.pth").string() + "' does not exist"), std::string::npos) << log();
  EXPECT_FALSE(fs::exists(out));
  // ONNX is export's job: a safetensors file under an .onnx name would mislead whoever opens it.
  const fs::path onnx = dir_ / "x.onnx";
  EXPECT_EQ(resnet({"import", (dir_ / "r18.pth").string(), "--model", "resnet18", "--out", onnx.string()}), 1);
  EXPECT_NE(log().find("then: resnet export --weights W.safetensors --out " + onnx.string()), std::string::npos)
      << log();
  EXPECT_FALSE(fs::exists(onnx));
  // Nor under a PyTorch name (torch.load cannot read it), nor with the model left to a default.
  const fs::path pth = dir_ / "x.PTH";
  EXPECT_EQ(resnet({"import", (dir_ / "r18.pth").string(), "--model", "resnet18", "--out", pth.string()}), 1);
  EXPECT_NE(log().find("torch.load cannot read, so '" + pth.string() + "' would mislead"), std::string::npos) << log();
  EXPECT_EQ(resnet({"export", "--weights", (dir_ / "r18.pth").string(), "--out", pth.string()}), 1);
  EXPECT_FALSE(fs::exists(pth));
  EXPECT_EQ(resnet({"import", (dir_ / "other.pth").string(), "--out", out.string()}), 1);
  EXPECT_NE(log().find("is not one of torchvision's ResNets by its tensors; name the model the weights are for: "
                       "--model resnet50"),
            std::string::npos)
      << log();
  // Export of weights that are neither ours nor torchvision's: no built-in recipe stands in.
  EXPECT_EQ(resnet({"export", "--weights", (dir_ / "other.pth").string(), "--out", out.string()}), 1);
  EXPECT_NE(log().find("records no config and its tensors are not one of torchvision's ResNets: say which model"),
            std::string::npos)
      << log();
  EXPECT_EQ(log().find("resnet20"), std::string::npos) << log();
  // Training from a file that does not fit stops before the first step, naming the way out.
  EXPECT_EQ(
      resnet({"train", "--set", "model.name=resnet18", "--set", "model.num_classes=10", "--set",
              "model.pretrained=" + (dir_ / "r18.pth").string(), "--set", "run.out_dir=" + (dir_ / "runs").string(),
              "--set", "data.dataset=synthetic", "--set", "model.in_channels=3", "--set", "model.image_size=32",
              "--set", "data.mean=[0.5, 0.5, 0.5]", "--set", "data.std=[0.5, 0.5, 0.5]"}),
      1);
  EXPECT_NE(log().find("model.pretrained_exclude=[fc]"), std::string::npos) << log();
  EXPECT_NE(log().find("give the model its 1000 classes: model.num_classes=1000"), std::string::npos) << log();
}

// Weights files written here, with no PyTorch: a model's own tensors, some of them changed.
class ImportOwnFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(RN_BINARY_DIR) / "test_runs" / "import_own_files" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // `model`'s tensors with `num_classes`, `edit` applied to them, written (without a config) as
  // `file`. The input channels are those `resnet import --model` gives the model: 3 for the
  // ImageNet models, 1 (the built-in Fashion-MNIST recipe's) for the CIFAR ones.
  template <class Edit>
  fs::path write(const std::string& file, const std::string& model, int64_t num_classes, Edit edit) {
    ModelOptions o = default_model_options(model);
    o.in_channels = model == "resnet50_gdw" ? 3 : 1, o.num_classes = num_classes;
    Model m(build_model(model, o));
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& n : m.names()) tensors.emplace_back(n, m.named(n));
    edit(tensors);
    write_safetensors((dir_ / file).string(), tensors);
    return dir_ / file;
  }
  Tensor& find(std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& name) {
    const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
    EXPECT_NE(it, tensors.end()) << name;
    return it->second;
  }
  int resnet(const std::vector<std::string>& args) { return wait_for(spawn(args, dir_ / "log.txt")); }
  std::string log() const { return read_all(dir_ / "log.txt"); }
  std::string config_of(const fs::path& weights) const {
    return SafetensorsFile::load(weights.string()).metadata().at("config_yaml");
  }
  fs::path dir_;
};

// The class count comes from the file's classifier for every model, not only for the torchvision
// layouts recognised by their tensors: resnet50_gdw's and the CIFAR ResNets' too.
TEST_F(ImportOwnFiles, ClassCountComesFromTheFileForEveryModel) {
  for (const auto& [model, classes] :
       std::vector<std::pair<std::string, int64_t>>{{"resnet50_gdw", 7}, {"resnet20", 100}}) {
    SCOPED_TRACE(model);
    ASSERT_NE(classes, default_model_options(model).num_classes);
    const fs::path in = write(model + ".safetensors", model, classes, [](auto&) {});
    const fs::path out = dir_ / (model + "_imported.safetensors");
    ASSERT_EQ(resnet({"import", in.string(), "--model", model, "--out", out.string()}), 0) << log();
    EXPECT_NE(config_of(out).find("num_classes: " + std::to_string(classes)), std::string::npos) << config_of(out);
  }
  // --set still has the last word.
  const fs::path in = dir_ / "resnet20.safetensors", out = dir_ / "set.safetensors";
  EXPECT_EQ(
      resnet({"import", in.string(), "--model", "resnet20", "--set", "model.num_classes=10", "--out", out.string()}),
      1);
  EXPECT_NE(log().find("give the model its 100 classes: model.num_classes=100"), std::string::npos) << log();
}

// A negative running variance is finite, but makes every output of its channel NaN: said at
// import, naming the tensor and the count. An infinite one is said to possibly make outputs NaN (it
// does not always: the channel then outputs beta).
TEST_F(ImportOwnFiles, NegativeRunningVarianceIsWarnedAbout) {
  const fs::path neg = write("neg.safetensors", "resnet20", 10, [&](auto& t) {
    Tensor& v = find(t, "layer2.1.bn1.running_var");
    v.ptr<float>()[0] = -1.0f, v.ptr<float>()[3] = -0.5f;
  });
  ASSERT_EQ(resnet({"import", neg.string(), "--model", "resnet20", "--out", (dir_ / "a.safetensors").string()}), 0)
      << log();
  EXPECT_NE(log().find("1 tensor holds negative batch-norm running variances: 'layer2.1.bn1.running_var' (2 of 32 "
                       "channels)"),
            std::string::npos)
      << log();
  EXPECT_NE(log().find("every output of those channels becomes NaN"), std::string::npos) << log();
  EXPECT_EQ(log().find("not finite"), std::string::npos) << log();
  fs::remove(dir_ / "log.txt");
  const fs::path inf = write("inf.safetensors", "resnet20", 10, [&](auto& t) {
    Tensor& v = find(t, "bn1.running_var");
    v.ptr<float>()[0] = INFINITY;
  });
  ASSERT_EQ(resnet({"import", inf.string(), "--model", "resnet20", "--out", (dir_ / "b.safetensors").string()}), 0)
      << log();
  EXPECT_NE(log().find("'bn1.running_var' (1 of 16 values); they may make the model's outputs NaN"), std::string::npos)
      << log();
  EXPECT_EQ(log().find("negative batch-norm"), std::string::npos) << log();
}

// A classifier that differs other than in its class count gets no model.num_classes advice
// that cannot help; what differs is said instead.
TEST_F(ImportOwnFiles, ClassifierMismatchAdviceSaysWhatDiffers) {
  HostTensor narrow({10, 20}, DType::f32), flat({10}, DType::f32);
  const fs::path a = write("narrow.safetensors", "resnet20", 10, [&](auto& t) { find(t, "fc.weight") = narrow; });
  EXPECT_EQ(resnet({"import", a.string(), "--model", "resnet20", "--out", (dir_ / "x.safetensors").string()}), 1);
  EXPECT_NE(log().find("the file's classifier reads 20 features and the model's 64"), std::string::npos) << log();
  EXPECT_EQ(log().find("model.num_classes="), std::string::npos) << log();
  fs::remove(dir_ / "log.txt");
  const fs::path b = write("flat.safetensors", "resnet20", 10, [&](auto& t) { find(t, "fc.weight") = flat; });
  EXPECT_EQ(resnet({"import", b.string(), "--model", "resnet20", "--out", (dir_ / "x.safetensors").string()}), 1);
  EXPECT_NE(log().find("the file's fc.weight has shape [10], not [classes, features]"), std::string::npos) << log();
  EXPECT_EQ(log().find("model.num_classes="), std::string::npos) << log();
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
}

// loss.label_smoothing is used as a float: a value that rounds to 1 is refused naming the key and
// the value given, not by the loss quoting a 1 the user never wrote.
TEST_F(ImportOwnFiles, LabelSmoothingThatRoundsToOneIsRefusedByTheConfig) {
  const fs::path in = write("w.safetensors", "resnet20", 10, [](auto&) {});
  EXPECT_EQ(resnet({"import", in.string(), "--model", "resnet20", "--set", "loss.label_smoothing=0.99999999", "--out",
                    (dir_ / "x.safetensors").string()}),
            1);
  EXPECT_NE(log().find("key 'loss.label_smoothing' = 0.99999999 rounds to 1 as a float"), std::string::npos) << log();
  fs::remove(dir_ / "log.txt");
  ASSERT_EQ(resnet({"import", in.string(), "--model", "resnet20", "--set", "loss.label_smoothing=0.9999999", "--out",
                    (dir_ / "x.safetensors").string()}),
            0)
      << log();
}

}  // namespace
}  // namespace rn

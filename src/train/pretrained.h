// Starting a model from weights trained elsewhere (model.pretrained, `resnet import`): a
// resnet.cpp checkpoint or weights file, any safetensors file with torchvision's names, or a
// PyTorch file written by torch.save (torchvision's own "resnet50-0676ba61.pth", a training
// script's checkpoint), read natively by model/torch_file.h.
//
// The load is strict, like every load here: every tensor of the model is in the file with the
// model's shape, and the file holds nothing the model lacks, except what `exclude` names.
// Excluded tensors (a classifier for another number of classes: exclude ["fc"]) keep the values
// they have. Everything is checked before a single float is written, so a failed load leaves
// the model as it was. Errors name the file and every tensor at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace rn {

struct PretrainedLoad {
  std::string format;                  // "safetensors", "PyTorch zip" or "PyTorch legacy"
  std::string key;                     // PyTorch: where the state dict was ("" for the whole file, "state_dict", ...)
  bool stripped_module = false;        // every name began with "module." (DataParallel), stripped
  int64_t loaded = 0;                  // model tensors set from the file
  std::vector<std::string> excluded;   // model tensors left as they were
  std::vector<std::string> converted;  // source dtypes converted to F32 ("F16", "BF16", "F64"), once each
  int64_t ignored = 0;                 // file tensors not loaded: BN counters, optimizer state, excluded names

  // "265 tensors from a PyTorch zip file (its 'state_dict'); kept: fc.weight, fc.bias"
  std::string summary() const;
};

// Sets the model's parameters and running statistics from `path`. Names in `exclude` are
// tensor names or prefixes of them at a dot ("fc" means fc.weight and fc.bias; "layer4" the whole
// stage); each must match a tensor of the model.
PretrainedLoad load_pretrained(const std::string& path, Model& model, const std::vector<std::string>& exclude = {});

// True when `path` starts like a file torch.save wrote (model/torch_file.h), not safetensors.
bool is_pytorch_file(const std::string& path);

// Warns, naming the first few tensors, of loaded weights that can make the model's outputs NaN:
// values that are not finite, and negative batch-norm running variances. `source` names where
// they came from (a file, a checkpoint).
void warn_non_finite(const Model& model, const std::string& source);

// A torchvision ImageNet ResNet recognised by its tensors: which one, and its classifier size.
struct TorchvisionResnet {
  std::string name;         // "resnet18", "resnet34", "resnet50", "resnet101" or "resnet152"
  int64_t num_classes = 0;  // fc.weight's rows
};
using TensorShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;
// The torchvision ResNet whose state dict has exactly these names' stem, stage depths, widths
// and classifier (a "module." prefix on every name is ignored), or nothing: another network,
// a wide or grouped variant, a deep stem. The strict load still checks every tensor.
std::optional<TorchvisionResnet> torchvision_resnet_of(const TensorShapes& tensors);
// The same for a weights file (PyTorch or safetensors); throws rn::Error naming an unreadable one.
std::optional<TorchvisionResnet> torchvision_resnet_in(const std::string& path);

}  // namespace rn

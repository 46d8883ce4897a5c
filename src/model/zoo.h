// The ResNet zoo.
//   resnet18/34/50/101/152: torchvision's layout and parameter names, v1.5 (the stride of
//     a bottleneck sits on its 3x3 conv), so torchvision weights load by name.
//   resnet20/32/44/56/110: CIFAR ResNets (He et al. 2016, section 4.2): 3x3 stem with 16
//     channels, three stages of (depth-2)/6 basic blocks with 16/32/64 channels, projection
//     shortcuts (1x1 conv + BN) where the shape changes; any number of input channels.
//   resnet50_gdw: the hardware-adapted ResNet-50: a deep stem of three 3x3 convs
//     (32, 32, 64 channels; "stem.0", "stem.1", ...), every 1x1 conv in the bottlenecks with
//     groups=4, and depthwise 3x3 convs in stages 3 and 4 (where the four channel groups
//     therefore never mix until fc; docs/weights.md).
#pragma once

#include <string>
#include <vector>

#include "model/graph.h"

namespace rn {

struct ModelOptions {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  int64_t height = 224, width = 224;
  bool zero_init_residual = false;  // gamma of each block's last BN starts at 0
};

Graph build_model(const std::string& name, const ModelOptions& options);
std::vector<std::string> model_names();
// What a model is made for, where a caller names no input or classes: 3x224x224 and 1000
// classes (ImageNet) for resnet18..152 and resnet50_gdw, 3x32x32 and 10 classes (CIFAR-10)
// for resnet20..110. An unknown name is refused as build_model refuses it.
ModelOptions default_model_options(const std::string& name);

}  // namespace rn

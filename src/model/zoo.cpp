#include "model/zoo.h"

#include <algorithm>
#include <sstream>

namespace rn {

namespace {

struct Builder {
  Graph& g;
  bool zero_init;

  // conv -> bn (optionally fused with relu); names follow torchvision.
  int conv_bn(int x, const std::string& conv_name, const std::string& bn_name, int64_t out, int64_t k, int64_t s,
              int64_t groups, BnFuse fuse) {
    int c = g.conv(x, conv_name, out, k, s, k / 2, groups);
    return g.batch_norm(c, bn_name, fuse);
  }

  int downsample(int x, const std::string& prefix, int64_t out, int64_t stride, int64_t groups) {
    int c = g.conv(x, prefix + "downsample.0", out, 1, stride, 0, groups);
    return g.batch_norm(c, prefix + "downsample.1", BnFuse::none);
  }

  int basic_block(int x, const std::string& prefix, int64_t planes, int64_t stride) {
    const int64_t in = g.node(x).shape[0];
    int shortcut = x;
    if (stride != 1 || in != planes) shortcut = downsample(x, prefix, planes, stride, 1);
    int h = conv_bn(x, prefix + "conv1", prefix + "bn1", planes, 3, stride, 1, BnFuse::relu);
    int c = g.conv(h, prefix + "conv2", planes, 3, 1, 1);
    return g.batch_norm(c, prefix + "bn2", BnFuse::add_relu, shortcut, zero_init);
  }

  // v1.5 bottleneck: the stride is on the 3x3 conv. `group_1x1` and `depthwise` select
  // the hardware-adapted variant.
  int bottleneck(int x, const std::string& prefix, int64_t planes, int64_t stride, int64_t group_1x1,
                 bool depthwise) {
    const int64_t in = g.node(x).shape[0], width = planes, out = planes * 4;
    int shortcut = x;
    if (stride != 1 || in != out) shortcut = downsample(x, prefix, out, stride, group_1x1);
    int h = conv_bn(x, prefix + "conv1", prefix + "bn1", width, 1, 1, group_1x1, BnFuse::relu);
    h = conv_bn(h, prefix + "conv2", prefix + "bn2", width, 3, stride, depthwise ? width : 1, BnFuse::relu);
    int c = g.conv(h, prefix + "conv3", out, 1, 1, 0, group_1x1);
    return g.batch_norm(c, prefix + "bn3", BnFuse::add_relu, shortcut, zero_init);
  }

  int head(int x, int64_t num_classes) {
    int p = g.global_avg_pool(x, "avgpool");
    return g.linear(p, "fc", num_classes);
  }
};

void check_options(const std::string& name, const ModelOptions& o) {
  RN_CHECK(o.num_classes > 1) << "model '" << name << "': num_classes must be at least 2, got " << o.num_classes;
  RN_CHECK(o.in_channels > 0) << "model '" << name << "': in_channels must be positive";
  RN_CHECK(o.height > 0 && o.width > 0) << "model '" << name << "': image size must be positive";
}

Graph imagenet_resnet(const std::string& name, const ModelOptions& o, bool bottleneck, const int (&blocks)[4],
                      bool adapted) {
  Graph g;
  g.name = name;
  Builder b{g, o.zero_init_residual};
  int x = g.input(o.in_channels, o.height, o.width);
  if (adapted) {
    // Deep stem: three 3x3 convs replace the 7x7 (as in ResNet-C/D); indices follow an
    // nn.Sequential of conv, bn, relu triples.
    x = b.conv_bn(x, "stem.0", "stem.1", 32, 3, 2, 1, BnFuse::relu);
    x = b.conv_bn(x, "stem.3", "stem.4", 32, 3, 1, 1, BnFuse::relu);
    x = b.conv_bn(x, "stem.6", "stem.7", 64, 3, 1, 1, BnFuse::relu);
  } else {
    int c = g.conv(x, "conv1", 64, 7, 2, 3);
    x = g.batch_norm(c, "bn1", BnFuse::relu);
  }
  x = g.max_pool(x, "maxpool", 3, 2, 1);
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int i = 0; i < blocks[stage]; ++i) {
      std::ostringstream prefix;
      prefix << "layer" << stage + 1 << "." << i << ".";
      const int64_t stride = (i == 0 && stage > 0) ? 2 : 1;
      if (bottleneck)
        x = b.bottleneck(x, prefix.str(), planes[stage], stride, adapted ? 4 : 1, adapted && stage >= 2);
      else
        x = b.basic_block(x, prefix.str(), planes[stage], stride);
    }
  }
  b.head(x, o.num_classes);
  return g;
}

Graph cifar_resnet(const std::string& name, const ModelOptions& o, int depth) {
  RN_CHECK((depth - 2) % 6 == 0) << "CIFAR ResNet depth must be 6n+2, got " << depth;
  const int n = (depth - 2) / 6;
  Graph g;
  g.name = name;
  Builder b{g, o.zero_init_residual};
  int x = g.input(o.in_channels, o.height, o.width);
  x = b.conv_bn(x, "conv1", "bn1", 16, 3, 1, 1, BnFuse::relu);
  const int64_t planes[3] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (int i = 0; i < n; ++i) {
      std::ostringstream prefix;
      prefix << "layer" << stage + 1 << "." << i << ".";
      x = b.basic_block(x, prefix.str(), planes[stage], (i == 0 && stage > 0) ? 2 : 1);
    }
  }
  b.head(x, o.num_classes);
  return g;
}

}  // namespace

std::vector<std::string> model_names() {
  return {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet20",
          "resnet32", "resnet44", "resnet56", "resnet110", "resnet50_gdw"};
}

ModelOptions default_model_options(const std::string& name) {
  const std::vector<std::string> names = model_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    ModelOptions o;
    build_model(name, o);  // names the known models
  }
  ModelOptions o;
  if (name == "resnet20" || name == "resnet32" || name == "resnet44" || name == "resnet56" || name == "resnet110") {
    o.num_classes = 10;
    o.height = o.width = 32;
  }
  return o;
}

Graph build_model(const std::string& name, const ModelOptions& o) {
  check_options(name, o);
  static const int k18[4] = {2, 2, 2, 2}, k34[4] = {3, 4, 6, 3}, k101[4] = {3, 4, 23, 3}, k152[4] = {3, 8, 36, 3};
  if (name == "resnet18") return imagenet_resnet(name, o, false, k18, false);
  if (name == "resnet34") return imagenet_resnet(name, o, false, k34, false);
  if (name == "resnet50") return imagenet_resnet(name, o, true, k34, false);
  if (name == "resnet101") return imagenet_resnet(name, o, true, k101, false);
  if (name == "resnet152") return imagenet_resnet(name, o, true, k152, false);
  if (name == "resnet50_gdw") return imagenet_resnet(name, o, true, k34, true);
  if (name == "resnet20") return cifar_resnet(name, o, 20);
  if (name == "resnet32") return cifar_resnet(name, o, 32);
  if (name == "resnet44") return cifar_resnet(name, o, 44);
  if (name == "resnet56") return cifar_resnet(name, o, 56);
  if (name == "resnet110") return cifar_resnet(name, o, 110);
  std::ostringstream names;
  for (const auto& n : model_names()) names << " " << n;
  RN_FAIL() << "unknown model '" << name << "'; known models:" << names.str();
}

}  // namespace rn

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/stats.h"
#include "model/zoo.h"

namespace rn {
namespace {

int64_t count(const std::string& name, ModelOptions o = {}) { return Model(build_model(name, o)).param_count(); }

TEST(Zoo, ParameterCountsMatchTorchvision) {
  EXPECT_EQ(count("resnet18"), 11689512);
  EXPECT_EQ(count("resnet34"), 21797672);
  EXPECT_EQ(count("resnet50"), 25557032);
  EXPECT_EQ(count("resnet101"), 44549160);
  EXPECT_EQ(count("resnet152"), 60192808);
}

TEST(Zoo, Resnet50ForwardMacs) {
  const ModelStats s = model_stats(build_model("resnet50", {}));
  // torchvision's ResNet-50 at 224x224: about 4.1 GMACs (convs 4.0886e9 + fc 2.048e6).
  EXPECT_NEAR(static_cast<double>(s.macs), 4.0907e9, 0.002e9);
  EXPECT_EQ(s.conv_layers, 53);
  EXPECT_EQ(s.bn_layers, 53);
}

TEST(Zoo, CifarResnets) {
  ModelOptions o;
  o.in_channels = 1;
  o.height = o.width = 28;
  o.num_classes = 10;
  // resnet20 with projection shortcuts (two 1x1 conv + BN on the stage transitions).
  const Graph g = build_model("resnet20", o);
  const ModelStats s = model_stats(g);
  EXPECT_EQ(s.conv_layers, 19 + 2);
  EXPECT_EQ(g.node(g.output()).shape, Shape({10}));
  for (const char* name : {"resnet32", "resnet44", "resnet56", "resnet110"}) EXPECT_GT(count(name, o), count("resnet20", o));
}

TEST(Zoo, AdaptedResnet50) {
  const Graph g = build_model("resnet50_gdw", {});
  int depthwise = 0, grouped_1x1 = 0, stem_3x3 = 0;
  for (const Node& n : g.nodes()) {
    const auto* c = attrs_if<ConvAttrs>(n);
    if (!c) continue;
    if (n.name.rfind("stem.", 0) == 0) {
      EXPECT_EQ(c->p.kernel_h, 3);
      ++stem_3x3;
    }
    if (c->p.kernel_h == 1) {
      EXPECT_EQ(c->p.groups, 4) << n.name;
      ++grouped_1x1;
    }
    if (c->p.kernel_h == 3 && c->p.groups > 1) {
      EXPECT_EQ(c->p.groups, c->p.in_channels) << n.name;
      EXPECT_TRUE(n.name.rfind("layer3.", 0) == 0 || n.name.rfind("layer4.", 0) == 0) << n.name;
      ++depthwise;
    }
  }
  EXPECT_EQ(stem_3x3, 3);
  EXPECT_EQ(depthwise, 6 + 3);
  EXPECT_EQ(grouped_1x1, 16 * 2 + 4);
  EXPECT_LT(Model(build_model("resnet50_gdw", {})).param_count(), count("resnet50"));
}

TEST(Zoo, UnknownModelListsKnownOnes) {
  try {
    build_model("resnet51", {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet50_gdw"), std::string::npos) << e.what();
  }
}

TEST(Zoo, DefaultOptionsAreWhatEachModelIsMadeFor) {
  for (const std::string& name : model_names()) {
    const ModelOptions o = default_model_options(name);
    const bool cifar =
        name == "resnet20" || name == "resnet32" || name == "resnet44" || name == "resnet56" || name == "resnet110";
    EXPECT_EQ(o.num_classes, cifar ? 10 : 1000) << name;
    EXPECT_EQ(o.height, cifar ? 32 : 224) << name;
    EXPECT_EQ(o.width, o.height) << name;
    EXPECT_EQ(o.in_channels, 3) << name;
    EXPECT_NO_THROW(build_model(name, o)) << name;
  }
  EXPECT_THROW(default_model_options("resnet51"), Error);
}

TEST(Zoo, ParamsOrderedByGradientProduction) {
  Model m(build_model("resnet18", {}));
  EXPECT_EQ(m.params().params.front().name, "fc.weight");
  EXPECT_EQ(m.params().params.back().name, "conv1.weight");  // the stem conv: last gradient
  for (const auto& p : m.params().params) {
    EXPECT_EQ(p.offset % 16, 0);
    const bool weight = p.kind == ParamKind::conv_weight || p.kind == ParamKind::linear_weight;
    EXPECT_EQ(p.weight_decay, weight) << p.name;
    EXPECT_EQ(p.lars_adapt, weight) << p.name;
  }
}

}  // namespace
}  // namespace rn

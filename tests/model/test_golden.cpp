// Golden parity with torchvision: logits, loss, running stats and every parameter
// gradient of one training step, for resnet18, resnet50 (batch 2, 224x224) and a CIFAR
// ResNet, on every CPU backend. The goldens are made by tools/golden.py into the build
// tree when the test runs (never committed); without python3-torch the test is skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "model/model.h"
#include "model/plan.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "ops/backend.h"

namespace rn {
namespace {

// Norm-wise relative error bound for fp32 (the bound; do not widen it).
constexpr double kGoldenTolerance = 1e-4;

struct GoldenCase {
  std::string model;
  int channels, size, classes, batch;
};

std::string case_name(const GoldenCase& c) { return c.model + "_" + std::to_string(c.size); }

bool torch_available() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1") == 0;
  return ok;
}

// Generates (once per build tree) and returns the path of the golden file for `c`.
std::string golden_path(const GoldenCase& c) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(RN_BINARY_DIR) / "golden";
  fs::create_directories(dir);
  const fs::path out = dir / (case_name(c) + ".safetensors");
  if (!fs::exists(out)) {
    const std::string cmd = "/usr/bin/python3 " RN_SOURCE_DIR "/tools/golden.py --model " + c.model +
                            " --channels " + std::to_string(c.channels) + " --size " + std::to_string(c.size) +
                            " --classes " + std::to_string(c.classes) + " --batch " + std::to_string(c.batch) +
                            " --out " + out.string();
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return out.string();
}

double rel_error(const Tensor& ours, const Tensor& ref) {
  EXPECT_EQ(ours.numel(), ref.numel());
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = ours.ptr<float>()[i], b = ref.ptr<float>()[i];
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Copies an fp32 NCHW batch into the plan's input (its layout; fp32 plans only).
void fill_input(const Tensor& dst, const Tensor& src) {
  const int64_t N = src.shape[0], C = src.shape[1], H = src.shape[2], W = src.shape[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) dst.ptr<float>()[dst.offset(n, c, h, w)] = src.ptr<float>()[src.offset(n, c, h, w)];
}

class GoldenParity : public ::testing::TestWithParam<std::tuple<GoldenCase, std::string>> {};

TEST_P(GoldenParity, MatchesTorchvision) {
  if (!torch_available()) GTEST_SKIP() << "python3-torch/torchvision not importable by /usr/bin/python3";
  const auto& [c, backend_name] = GetParam();
  const SafetensorsFile golden = SafetensorsFile::load(golden_path(c));
  ModelOptions o;
  o.in_channels = c.channels;
  o.height = o.width = c.size;
  o.num_classes = c.classes;
  Model model(build_model(c.model, o));
  for (const std::string& name : model.names()) {
    Tensor dst = model.named(name), src = golden.view("param." + name);
    ASSERT_EQ(dst.shape, src.shape) << name;
    std::memcpy(dst.data, src.data, dst.bytes());
  }
  auto backend = make_backend(backend_name);
  PlanOptions po;
  po.batch = c.batch;
  po.layout = backend->preferred_layout();
  po.label_smoothing = std::stof(golden.metadata().at("label_smoothing"));
  Plan plan(model, backend.get(), po);
  fill_input(plan.input(), golden.view("input"));
  std::memcpy(plan.labels().data, golden.view("labels").data, plan.labels().bytes());

  model.zero_grads();
  plan.forward();
  plan.backward(1.0f);

  EXPECT_LT(rel_error(plan.logits(), golden.view("logits")), kGoldenTolerance) << "logits";
  const float loss = plan.loss(), ref_loss = golden.view("loss").ptr<float>()[0];
  EXPECT_LT(std::abs(loss - ref_loss) / std::abs(ref_loss), kGoldenTolerance) << "loss " << loss << " vs " << ref_loss;
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < model.params().params.size(); ++i) {
    const std::string& name = model.params().params[i].name;
    const double e = rel_error(model.grad(static_cast<int>(i)), golden.view("grad." + name));
    EXPECT_LT(e, kGoldenTolerance) << "gradient of " << name;
    if (e > worst) worst = e, worst_name = name;
  }
  for (size_t i = 0; i < model.state_views().size(); ++i) {
    const std::string& name = model.state_views()[i].name;
    EXPECT_LT(rel_error(model.state(static_cast<int>(i)), golden.view("running." + name)), kGoldenTolerance) << name;
  }
  if (const char* dump = std::getenv("RN_GOLDEN_DUMP")) {  // debugging aid: our gradients as safetensors
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < model.params().params.size(); ++i)
      out.emplace_back("grad." + model.params().params[i].name, model.grad(static_cast<int>(i)));
    out.emplace_back("logits", plan.logits());
    write_safetensors(std::string(dump) + "/" + case_name(c) + "_" + backend_name + ".safetensors", out);
  }
  std::printf("[golden] %s on %s: loss %.6f (torch %.6f), worst gradient error %.2e (%s)\n", c.model.c_str(),
              backend_name.c_str(), loss, ref_loss, worst, worst_name.c_str());
}

const GoldenCase kCases[] = {
    {"resnet20", 1, 28, 10, 4},
    {"resnet18", 3, 224, 1000, 2},
    {"resnet50", 3, 224, 1000, 2},
};

INSTANTIATE_TEST_SUITE_P(Zoo, GoldenParity, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("ref", "cpu")),
                         [](const auto& info) {
                           return case_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace rn

// Golden parity with torchvision: logits, loss, running stats and every parameter
// gradient of one training step, for resnet18, resnet50 (batch 2, 224x224) and a CIFAR
// ResNet, on every backend: ref and cpu in fp32, and cuda (when built and a GPU is present;
// skipped with a message otherwise) in fp32 with the same bound and in fp16/bf16 (the whole
// model in half, BN and master weights fp32, as precision O2) with the half bounds below.
// The goldens are made by tools/golden.py into the build tree when the test runs (never
// committed); without python3-torch the test is skipped.
#include <gtest/gtest.h>

#include <algorithm>
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
#include "python_for_tests.h"

namespace rn {
namespace {

// Norm-wise relative error bound for fp32 (the bound; do not widen it).
constexpr double kGoldenTolerance = 1e-4;
// Half precision against the fp32 goldens: every activation is rounded to 8 (bf16) or 11
// (fp16) significant bits at every layer, so errors compound with depth. Logits, loss and
// running statistics: a few roundings' worth; gradients are compared as one vector over all
// parameters (a single small tensor, such as a late BN's beta, can be dominated by noise).
struct HalfBounds {
  double logits, grads, stats;
};
HalfBounds half_bounds(DType t) {
  return t == DType::f16 ? HalfBounds{2e-2, 5e-2, 2e-2} : HalfBounds{8e-2, 2e-1, 8e-2};
}

struct GoldenCase {
  std::string model;
  int channels, size, classes, batch;
};

std::string case_name(const GoldenCase& c) { return c.model + "_" + std::to_string(c.size); }

// The Python with torch and torchvision ($RN_PYTHON, else /usr/bin/python3), the source tree
// ($RN_SOURCE_DIR, else this build's) and the golden folder ($RN_GOLDEN_DIR, else the build
// tree's golden/): a build carried to a GPU machine points them at what is there.
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}
using test::python;

bool torch_available() {
  static const bool ok = std::system((python() + " -c 'import torch, torchvision' >/dev/null 2>&1").c_str()) == 0;
  return ok;
}

// Generates (once per build tree) and returns the path of the golden file for `c`.
std::string golden_path(const GoldenCase& c) {
  namespace fs = std::filesystem;
  const fs::path dir = env_or("RN_GOLDEN_DIR", (fs::path(RN_BINARY_DIR) / "golden").string());
  fs::create_directories(dir);
  const fs::path out = dir / (case_name(c) + ".safetensors");
  if (!fs::exists(out)) {
    const std::string cmd = python() + " " + env_or("RN_SOURCE_DIR", RN_SOURCE_DIR) + "/tools/golden.py --model " +
                            c.model + " --channels " + std::to_string(c.channels) + " --size " +
                            std::to_string(c.size) + " --classes " + std::to_string(c.classes) + " --batch " +
                            std::to_string(c.batch) + " --out " + out.string();
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

// Copies an fp32 NCHW batch into the plan's input (its layout and dtype), wherever the
// plan keeps it.
void fill_input(const Plan& plan, const Tensor& src) {
  const Tensor dst = plan.input();
  HostTensor staged(dst.shape, DType::f32, dst.layout);
  const Tensor& st = staged.view();
  const int64_t N = src.shape[0], C = src.shape[1], H = src.shape[2], W = src.shape[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          st.ptr<float>()[st.offset(n, c, h, w)] = src.ptr<float>()[src.offset(n, c, h, w)];
  HostTensor typed(dst.shape, dst.dtype, dst.layout);
  convert(typed.view().data, dst.dtype, st.data, DType::f32, static_cast<size_t>(st.numel()));
  plan.copy_from_host(dst, typed.view().data);
}

HostTensor to_host(const Plan& plan, const Tensor& t) {
  HostTensor h(t.shape, t.dtype, t.layout);
  plan.copy_to_host(h.view().data, t);
  return h;
}

bool cuda_runs(std::string* why) {
  const auto names = available_backends();
  if (std::find(names.begin(), names.end(), "cuda") == names.end()) {
    *why = "this build has no CUDA backend";
    return false;
  }
  try {
    make_backend("cuda");
    return true;
  } catch (const std::exception& e) {
    *why = std::string("no usable GPU: ") + e.what();
    return false;
  }
}

// One training step of the golden case from the golden weights, input and labels, on
// `backend_name` with the model in `dtype`; gradients and running statistics brought to the
// host. The backend comes first: the model's device buffers live in its memory.
struct GoldenStep {
  std::unique_ptr<Backend> backend;
  Model model;
  std::unique_ptr<Plan> plan;
  HostTensor logits;

  GoldenStep(const GoldenCase& c, const SafetensorsFile& golden, const std::string& backend_name, DType dtype)
      : backend(make_backend(backend_name)), model(build_model(c.model, [&] {
          ModelOptions o;
          o.in_channels = c.channels;
          o.height = o.width = c.size;
          o.num_classes = c.classes;
          return o;
        }())) {
    for (const std::string& name : model.names()) {
      Tensor dst = model.named(name), src = golden.view("param." + name);
      RN_CHECK(dst.shape == src.shape) << name << ": " << dst.str() << " vs the golden " << src.str();
      std::memcpy(dst.data, src.data, dst.bytes());
    }
    PlanOptions po;
    po.batch = c.batch;
    po.dtype = po.activation_dtype = dtype;
    po.layout = backend->preferred_layout();
    po.label_smoothing = std::stof(golden.metadata().at("label_smoothing"));
    plan = std::make_unique<Plan>(model, backend.get(), po);
    fill_input(*plan, golden.view("input"));
    plan->copy_from_host(plan->labels(), golden.view("labels").data);
    model.zero_grads();
    plan->forward();
    plan->backward(1.0f);
    backend->synchronize();
    model.to_host();  // a device model's gradients and running statistics
    logits = to_host(*plan, plan->logits());
  }
};

class GoldenParity : public ::testing::TestWithParam<std::tuple<GoldenCase, std::string>> {};

TEST_P(GoldenParity, MatchesTorchvision) {
  if (!torch_available()) GTEST_SKIP() << "torch/torchvision not importable by " << python();
  const auto& [c, backend_name] = GetParam();
  std::string why;
  if (backend_name == "cuda" && !cuda_runs(&why)) GTEST_SKIP() << "cuda golden not run: " << why;
  const SafetensorsFile golden = SafetensorsFile::load(golden_path(c));
  GoldenStep step(c, golden, backend_name, DType::f32);
  const Model& model = step.model;
  const Plan& plan = *step.plan;
  const HostTensor& logits = step.logits;

  EXPECT_LT(rel_error(logits, golden.view("logits")), kGoldenTolerance) << "logits";
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
    out.emplace_back("logits", logits.view());
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

// Only makes the golden files of every case (scripts/gpu-check.sh runs it in the background
// while the GPU runs the harness, so the parity tests find them made). Each file is written
// by tools/golden.py to a temporary and renamed: a parity test never reads a partial one.
TEST(GoldenFiles, MadeForEveryCase) {
  if (!torch_available()) GTEST_SKIP() << "torch/torchvision not importable by " << python();
  for (const GoldenCase& c : kCases) {
    const std::string path = golden_path(c);
    EXPECT_NO_THROW(SafetensorsFile::load(path).view("loss")) << path;
  }
}

// The same step with the whole model in half precision on the cuda backend.
class GoldenParityHalf : public ::testing::TestWithParam<std::tuple<GoldenCase, DType>> {};

TEST_P(GoldenParityHalf, CudaWithinHalfBounds) {
  if (!torch_available()) GTEST_SKIP() << "torch/torchvision not importable by " << python();
  std::string why;
  if (!cuda_runs(&why)) GTEST_SKIP() << "cuda half golden not run: " << why;
  const auto& [c, dtype] = GetParam();
  const HalfBounds bound = half_bounds(dtype);
  const SafetensorsFile golden = SafetensorsFile::load(golden_path(c));
  GoldenStep step(c, golden, "cuda", dtype);
  const Model& model = step.model;
  const Plan& plan = *step.plan;
  const HostTensor& logits = step.logits;
  const double logit_err = rel_error(logits, golden.view("logits"));
  EXPECT_LT(logit_err, bound.logits) << "logits";
  const float loss = plan.loss(), ref_loss = golden.view("loss").ptr<float>()[0];
  EXPECT_LT(std::abs(loss - ref_loss) / std::abs(ref_loss), bound.logits) << "loss " << loss << " vs " << ref_loss;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < model.params().params.size(); ++i) {
    const Tensor ours = model.grad(static_cast<int>(i)), ref = golden.view("grad." + model.params().params[i].name);
    for (int64_t k = 0; k < ref.numel(); ++k) {
      const double a = ours.ptr<float>()[k], b = ref.ptr<float>()[k];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  }
  const double grad_err = std::sqrt(diff / norm);
  EXPECT_LT(grad_err, bound.grads) << "all gradients as one vector";
  for (size_t i = 0; i < model.state_views().size(); ++i) {
    const std::string& name = model.state_views()[i].name;
    EXPECT_LT(rel_error(model.state(static_cast<int>(i)), golden.view("running." + name)), bound.stats) << name;
  }
  std::printf("[golden] %s on cuda in %s: logits error %.2e, loss %.6f (torch %.6f), gradient error %.2e\n",
              c.model.c_str(), std::string(dtype_name(dtype)).c_str(), logit_err, loss, ref_loss, grad_err);
}

INSTANTIATE_TEST_SUITE_P(Zoo, GoldenParityHalf,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values(DType::f16, DType::bf16)),
                         [](const auto& info) {
                           return case_name(std::get<0>(info.param)) + "_cuda_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

INSTANTIATE_TEST_SUITE_P(Zoo, GoldenParity,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("ref", "cpu", "cuda")),
                         [](const auto& info) {
                           return case_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace rn

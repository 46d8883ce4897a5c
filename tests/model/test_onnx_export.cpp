// ONNX export (`resnet export --out X.onnx`, model/onnx_export.h): the file holds every node
// of the graph as the standard operator, every parameter and running statistic bit for bit
// under its torchvision name, and, evaluated by an evaluator independent of our kernels
// (tools/onnx_check.py: each ONNX operator's definition in PyTorch's functional ops, run by
// Debian's python3-onnx and python3-torch), gives the logits our reference backend gives,
// for the plain, the CIFAR and the hardware-adapted (grouped, depthwise, deep-stem) ResNets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "core/rng.h"
#include "model/model.h"
#include "model/onnx_export.h"
#include "model/plan.h"
#include "model/zoo.h"
#include "ops/backend.h"
#include "python_for_tests.h"

#ifdef RN_HAVE_ONNX
#include <onnx/onnx_pb.h>
#endif

namespace rn {
namespace {

namespace fs = std::filesystem;

struct OnnxCase {
  std::string model;
  int64_t channels, size, classes;
};

Model make_model(const OnnxCase& c, uint64_t seed) {
  ModelOptions o;
  o.in_channels = c.channels;
  o.height = o.width = c.size;
  o.num_classes = c.classes;
  Model m(build_model(c.model, o));
  m.init(seed);
  // Batch norms that do something in evaluation: gamma, beta and running statistics away
  // from their initial 1, 0, 0, 1 (which would hide swapped inputs).
  Rng rng(seed + 1);
  for (const std::string& name : m.names()) {
    Tensor t = m.named(name);
    float* p = t.ptr<float>();
    const bool bn = t.shape.rank() == 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (name.ends_with("running_var"))
        p[i] = rng.uniform(0.5f, 1.5f);
      else if (name.ends_with("running_mean") || (bn && name.ends_with("bias")))
        p[i] = rng.uniform(-0.2f, 0.2f);
      else if (bn && name.ends_with("weight"))
        p[i] = rng.uniform(0.5f, 1.5f);
    }
  }
  return m;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(RN_BINARY_DIR) / "test_runs" / "onnx" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using test::python;

bool python_has_onnx_and_torch() {
  static const bool ok = std::system((python() + " -c 'import onnx, torch' >/dev/null 2>&1").c_str()) == 0;
  return ok;
}

void write_floats(const fs::path& p, const float* data, int64_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  ASSERT_TRUE(f.good()) << p;
}

void PrintTo(const OnnxCase& c, std::ostream* os) {
  *os << c.model << " " << c.channels << "x" << c.size << "x" << c.size << ", " << c.classes << " classes";
}

class OnnxExport : public ::testing::TestWithParam<OnnxCase> {};

TEST_P(OnnxExport, EvaluatesToTheReferenceBackendsLogits) {
  if (!onnx_export_available()) GTEST_SKIP() << "built without libonnx: ONNX export not available";
  if (!python_has_onnx_and_torch())
    GTEST_SKIP() << "onnx and torch not importable by " << python() << " (python3-onnx, python3-torch)";
  const OnnxCase& c = GetParam();
  const fs::path dir = fresh_dir(c.model);
  Model model = make_model(c, 7);

  // Our logits in evaluation mode, on the reference backend.
  auto backend = make_backend("ref");
  const ExportSample sample = export_sample(model, *backend, 2, 11);
  const HostTensor& x = sample.input;
  const HostTensor& logits = sample.logits;

  const OnnxExportInfo info = save_onnx((dir / "model.onnx").string(), model);
  EXPECT_EQ(static_cast<size_t>(info.initializers), model.names().size());
  EXPECT_EQ(static_cast<size_t>(info.bytes), fs::file_size(dir / "model.onnx"));
  write_floats(dir / "input.f32", x.ptr<float>(), x.numel());
  write_floats(dir / "logits.f32", logits.ptr<float>(), logits.numel());
  const std::string cmd = python() + " " + RN_SOURCE_DIR + "/tools/onnx_check.py " + (dir / "model.onnx").string() +
                          " --input " + (dir / "input.f32").string() + " --logits " + (dir / "logits.f32").string() +
                          " > " + (dir / "check.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "check.log");
  const std::string out{std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>()};
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("relative error"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Zoo, OnnxExport,
                         ::testing::Values(OnnxCase{"resnet20", 3, 16, 10}, OnnxCase{"resnet18", 3, 64, 7},
                                           OnnxCase{"resnet50_gdw", 3, 64, 5}),
                         [](const auto& info) { return info.param.model; });

#ifdef RN_HAVE_ONNX
TEST(OnnxExportFile, HoldsEveryNodeAndTensorByNameBitForBit) {
  const OnnxCase c{"resnet50", 3, 64, 10};
  Model model = make_model(c, 3);
  const fs::path path = fresh_dir("resnet50") / "model.onnx";
  const OnnxExportInfo info = save_onnx(path.string(), model);

  onnx::ModelProto proto;
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&f)) << path;
  ASSERT_EQ(proto.opset_import_size(), 1);
  EXPECT_EQ(proto.opset_import(0).version(), kOnnxOpset);
  const onnx::GraphProto& g = proto.graph();
  EXPECT_EQ(g.node_size(), info.nodes);

  // Operators: one Conv per convolution, a BatchNormalization per batch norm, an Add per
  // residual join (16 blocks), a Relu per fused ReLU, one of each of the rest.
  std::map<std::string, int> ops;
  for (const auto& n : g.node()) ++ops[n.op_type()];
  int convs = 0, bns = 0, adds = 0, relus = 0;
  for (const Node& n : model.graph().nodes()) {
    convs += attrs_if<ConvAttrs>(n) != nullptr;
    if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
      ++bns;
      adds += b->fuse == BnFuse::add_relu;
      relus += b->fuse != BnFuse::none;
    }
  }
  EXPECT_EQ(ops["Conv"], convs);
  EXPECT_EQ(convs, 53);
  EXPECT_EQ(ops["BatchNormalization"], bns);
  EXPECT_EQ(ops["Add"], 16);
  EXPECT_EQ(ops["Add"], adds);
  EXPECT_EQ(ops["Relu"], relus);
  EXPECT_EQ(ops["MaxPool"], 1);
  EXPECT_EQ(ops["GlobalAveragePool"], 1);
  EXPECT_EQ(ops["Flatten"], 1);
  EXPECT_EQ(ops["Gemm"], 1);

  // Input and output: names, symbolic batch, per-sample shapes.
  ASSERT_EQ(g.input_size(), 1);
  ASSERT_EQ(g.output_size(), 1);
  EXPECT_EQ(g.input(0).name(), "input");
  EXPECT_EQ(g.output(0).name(), "logits");
  const auto& in = g.input(0).type().tensor_type().shape();
  ASSERT_EQ(in.dim_size(), 4);
  EXPECT_EQ(in.dim(0).dim_param(), "N");
  EXPECT_EQ(in.dim(1).dim_value(), 3);
  EXPECT_EQ(in.dim(3).dim_value(), 64);
  const auto& out = g.output(0).type().tensor_type().shape();
  ASSERT_EQ(out.dim_size(), 2);
  EXPECT_EQ(out.dim(1).dim_value(), 10);

  // Every parameter and running statistic, by name, with its shape and its exact bytes.
  std::set<std::string> names;
  for (const auto& t : g.initializer()) {
    names.insert(t.name());
    const Tensor ours = model.named(t.name());
    ASSERT_EQ(t.dims_size(), ours.shape.rank()) << t.name();
    for (int i = 0; i < ours.shape.rank(); ++i) EXPECT_EQ(t.dims(i), ours.shape[i]) << t.name();
    ASSERT_EQ(t.raw_data().size(), ours.bytes()) << t.name();
    EXPECT_EQ(std::memcmp(t.raw_data().data(), ours.data, ours.bytes()), 0) << t.name();
  }
  const std::vector<std::string> all = model.names();
  EXPECT_EQ(names, std::set<std::string>(all.begin(), all.end()));
}
#endif

TEST(OnnxExportFile, AnUnwritablePathIsAnErrorNamingItAndLeavesNothing) {
  if (!onnx_export_available()) GTEST_SKIP() << "built without libonnx: ONNX export not available";
  Model model = make_model({"resnet20", 1, 8, 10}, 1);
  const fs::path dir = fresh_dir("unwritable");
  const std::string path = (dir / "missing" / "model.onnx").string();
  try {
    save_onnx(path, model);
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace rn

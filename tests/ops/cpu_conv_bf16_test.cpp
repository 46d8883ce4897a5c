// The cpu backend's bf16 convolutions in their two arithmetics (backends/cpu/conv2d.cpp,
// CpuBackendOptions::bf16_conv_arithmetic): which one each shape gets, and that both equal
// the fp32 convolution of the same (bf16-representable) values within bf16's rounding of
// y and dx, and within the fp32 bound for dw and db, which are fp32 in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "conv_test_util.h"
#include "model/graph.h"
#include "model/model.h"
#include "model/plan.h"
#include "ops/backend.h"
#include "ops/conv2d.h"

namespace rn {
namespace {

using Arith = CpuBackendOptions::Bf16ConvArithmetic;

Conv2dDesc conv(int64_t c, int64_t k, int64_t kernel, int64_t stride, int64_t batch, int64_t size, Layout layout,
                DType dtype = DType::bf16, bool bias = false, int64_t groups = 1) {
  Conv2dDesc d;
  d.p.in_channels = c;
  d.p.out_channels = k;
  d.p.kernel_h = d.p.kernel_w = kernel;
  d.p.stride_h = d.p.stride_w = stride;
  d.p.pad_h = d.p.pad_w = kernel / 2;
  d.p.groups = groups;
  d.p.bias = bias;
  d.batch = batch;
  d.in_h = d.in_w = size;
  d.layout = layout;
  d.dtype = dtype;
  return d;
}

// `speedup`: the bf16/fp32 GEMM rate automatic goes by (0: this CPU's, measured).
std::unique_ptr<Backend> cpu(Arith arith, bool winograd = true, double speedup = 0) {
  CpuBackendOptions o;
  o.bf16_conv_arithmetic = arith;
  o.winograd = winograd;
  o.bf16_speedup = speedup;
  return make_cpu_backend(o);
}

// The rates of the two hosts the rule was measured on: dev-2c-xeon's bf16 GEMM at 0.6x its fp32
// one, dev-2c's (AMD EPYC) at 1.7x.
constexpr double kSlowBf16 = 0.6, kFastBf16 = 1.7;

// Whether the kernel computes its bf16 tensors in fp32 (Conv2dKernel::arithmetic()), checked
// against what its implementation() says.
bool fp32_arithmetic(const Conv2dKernel& k) {
  const bool widened = k.desc().dtype != DType::f32 && k.arithmetic() == DType::f32;
  EXPECT_EQ(widened, k.implementation().find("fp32 arithmetic") != std::string::npos)
      << "arithmetic() " << dtype_name(k.arithmetic()) << " against implementation() " << k.implementation();
  EXPECT_TRUE(k.arithmetic() == DType::f32 || k.arithmetic() == k.desc().dtype) << dtype_name(k.arithmetic());
  return widened;
}
bool winograd(const Conv2dKernel& k) { return k.implementation().find("wino") != std::string::npos; }

TEST(CpuConvBf16, ArithmeticChosenPerShape) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  const Layout l = Layout::nhwc;
  // 3x3 64 -> 64: 288 multiply-adds per activation element; 1x1 64 -> 256: 51; 1x1 128 ->
  // 512: 102; the threshold is 96.
  const Conv2dDesc c3 = conv(64, 64, 3, 1, 4, 21, l), c1_low = conv(64, 256, 1, 1, 4, 21, l),
                   c1_high = conv(128, 512, 1, 1, 4, 21, l),
                   grouped = conv(128, 512, 1, 1, 4, 21, l, DType::bf16, false, /*groups=*/4);
  auto native = cpu(Arith::native), fp32 = cpu(Arith::fp32);
  {  // bf16 slower than fp32 (dev-2c-xeon): fp32 where the conversions pay.
    auto automatic = cpu(Arith::automatic, true, kSlowBf16);
    const auto k3 = automatic->make_conv2d(c3);
    EXPECT_TRUE(fp32_arithmetic(*k3)) << k3->implementation();
    EXPECT_EQ(winograd(*k3), cpu_has_winograd()) << k3->implementation();
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(c1_low))) << "51 per element: not worth the conversions";
    EXPECT_TRUE(fp32_arithmetic(*automatic->make_conv2d(c1_high))) << "102 per element";
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(grouped))) << "grouped: native";
    const auto precise = cpu(Arith::automatic, /*winograd=*/false, kSlowBf16)->make_conv2d(c3);
    EXPECT_TRUE(fp32_arithmetic(*precise)) << "288 per element";
    EXPECT_FALSE(winograd(*precise)) << "high_precision mode: direct, in either arithmetic";
  }
  {  // bf16 faster (dev-2c): native throughout.
    auto automatic = cpu(Arith::automatic, true, kFastBf16);
    for (const Conv2dDesc& d : {c3, c1_low, c1_high, grouped}) {
      const auto k = automatic->make_conv2d(d);
      EXPECT_FALSE(fp32_arithmetic(*k)) << d.str() << ": " << k->implementation();
    }
  }
  {  // The line is 1: as fast is native, a little slower is fp32 where it pays.
    EXPECT_FALSE(fp32_arithmetic(*cpu(Arith::automatic, true, 1.0)->make_conv2d(c1_high)));
    EXPECT_TRUE(fp32_arithmetic(*cpu(Arith::automatic, true, 0.99)->make_conv2d(c1_high)));
    EXPECT_FALSE(fp32_arithmetic(*cpu(Arith::automatic, true, 0.99)->make_conv2d(c1_low)));
  }
  {  // Measured: this CPU's own choice, which follows the same line.
    auto automatic = cpu(Arith::automatic);
    const double s = cpu_bf16_speedup();
    EXPECT_GT(s, 0.05);
    EXPECT_LT(s, 100);
    const bool c1_high_fp32 = !cpu_has_amx() && s < 1;
    EXPECT_EQ(fp32_arithmetic(*automatic->make_conv2d(c1_high)), c1_high_fp32) << "bf16 speedup " << s;
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(c1_low))) << "bf16 speedup " << s;
  }
  for (const Conv2dDesc& d : {c3, c1_low, c1_high, grouped}) {
    const auto k = native->make_conv2d(d);
    EXPECT_FALSE(fp32_arithmetic(*k)) << d.str();
    EXPECT_NE(k->implementation().find("bf16"), std::string::npos) << k->implementation();
  }
  EXPECT_TRUE(fp32_arithmetic(*fp32->make_conv2d(c1_low))) << "asked for: every ungrouped shape";
  // A widened input whose channels do not fill oneDNN's blocks (the stem's 3) must still get a
  // real kernel, not oneDNN's reference loops ("ref:any"), in either layout.
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    const auto stem = fp32->make_conv2d(conv(3, 64, 7, 2, 2, 32, layout));
    EXPECT_TRUE(fp32_arithmetic(*stem));
    EXPECT_NE(stem->implementation().rfind("ref", 0), 0u) << stem->implementation();
  }
  EXPECT_FALSE(fp32_arithmetic(*fp32->make_conv2d(grouped)));
  EXPECT_FALSE(fp32_arithmetic(*fp32->make_conv2d(conv(64, 64, 3, 1, 4, 21, l, DType::f32)))) << "fp32 tensors";
}

// Precision O1's plan (bf16 convolutions, fp32 activations) at memory level O0, where every
// activation keeps its own buffer for the test to read.
PlanOptions o1_plan(int64_t batch) {
  PlanOptions po;
  po.batch = batch;
  po.dtype = DType::bf16;
  po.activation_dtype = DType::f32;
  po.layout = Layout::nhwc;
  po.memory = MemoryLevel::O0;
  return po;
}

// Precision O1 (bf16 convolutions among fp32 activations): the convolutions write their
// outputs and input gradients in fp32 themselves, so the plan drops the cast after each
// forward and after each backward-data step (it keeps the casts of what they read), and the
// step computes what the unfused plan does within bf16's rounding.
TEST(CpuConvBf16, O1PlanFusesTheCastsAfterEachConvolution) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  Graph g;
  g.name = "o1";
  const int in = g.input(16, 10, 10);
  const int c1 = g.conv(in, "c1", 32, 3, 1, 1);
  const int b1 = g.batch_norm(c1, "bn1", BnFuse::relu);
  const int c2 = g.conv(b1, "c2", 32, 1, 1, 0);
  const int b2 = g.batch_norm(c2, "bn2", BnFuse::add_relu, b1);
  g.linear(g.global_avg_pool(b2, "gap"), "fc", 5);
  Model model(std::move(g));
  model.init(3);
  auto backend = cpu(Arith::automatic);
  struct Result {
    int casts = 0;
    DType c1_out = DType::f32, c2_out = DType::f32;
    std::vector<float> logits, grads;
  };
  const auto step = [&](bool fuse) {
    PlanOptions po = o1_plan(4);
    po.fuse_conv_casts = fuse;
    Plan plan(model, backend.get(), po);
    Result r;
    for (const std::string& s : plan.step_names()) r.casts += s.rfind("cast ", 0) == 0 || s.rfind("bwd cast ", 0) == 0;
    r.c1_out = plan.activation(c1).dtype;
    r.c2_out = plan.activation(c2).dtype;
    const std::vector<float> x = testing::random_values(static_cast<size_t>(plan.input().numel()), 7);
    convert(plan.input().data, plan.input().dtype, x.data(), DType::f32, x.size());
    for (int i = 0; i < 4; ++i) plan.labels().ptr<int32_t>()[i] = i;
    model.zero_grads();
    plan.forward();
    plan.backward(1.0f);
    r.logits.assign(plan.logits().ptr<float>(), plan.logits().ptr<float>() + plan.logits().numel());
    r.grads.assign(model.grad_data(), model.grad_data() + model.params().total);
    return r;
  };
  const Result fused = step(true), plain = step(false);
  EXPECT_EQ(plain.c1_out, DType::bf16);
  EXPECT_EQ(fused.c1_out, DType::f32);
  EXPECT_EQ(fused.c2_out, DType::f32);
  // c1 and c2 lose their output casts; c2 (whose input needs a gradient) its dx cast; and
  // bn2, which alone reads c2's output, writes c2's dy in bf16 (its dy cast goes too).
  EXPECT_EQ(fused.casts, plain.casts - 4);
  // Both round x, w and dy to bf16; the unfused plan also rounds y and dx: 2^-9 relative each.
  EXPECT_LT(testing::conv_rel_error(fused.logits, plain.logits), 1e-2);
  EXPECT_LT(testing::conv_rel_error(fused.grads, plain.grads), 2e-2);
  EXPECT_GT(testing::conv_rel_error(fused.grads, plain.grads), 0) << "the same plan ran twice";
}

// Precision O1's remaining casts, fused into the batch norms (BatchNormDesc::half_y,
// half_dx): a batch norm that only convolutions read writes its y in bf16, and one that alone
// reads a convolution's fp32 output writes that convolution's dy in bf16. In a bottleneck only
// the cast of the block's input (which the residual reads in fp32) stays, and the stem's dy
// (its batch norm's y feeds that residual). At memory level O2, which recomputes the bf16
// outputs, the gradients are the same bits.
TEST(CpuConvBf16, O1BatchNormsWriteTheHalfCopiesTheConvolutionsRead) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  Graph g;
  g.name = "bottleneck";
  const int c0 = g.conv(g.input(16, 10, 10), "c0", 32, 3, 1, 1);
  const int b0 = g.batch_norm(c0, "b0", BnFuse::relu);
  const int c1 = g.conv(b0, "c1", 16, 1, 1, 0);
  const int b1 = g.batch_norm(c1, "b1", BnFuse::relu);
  const int c2 = g.conv(b1, "c2", 16, 3, 1, 1);
  const int b2 = g.batch_norm(c2, "b2", BnFuse::relu);
  const int c3 = g.conv(b2, "c3", 32, 1, 1, 0);
  const int b3 = g.batch_norm(c3, "b3", BnFuse::add_relu, b0);
  g.linear(g.global_avg_pool(b3, "gap"), "fc", 5);
  Model model(std::move(g));
  auto backend = cpu(Arith::automatic);
  ASSERT_TRUE(backend->bn_half_io(Layout::nhwc, DType::bf16));
  int seed = 1;
  const auto grads = [&](bool fuse, MemoryLevel memory, DType conv_dtype = DType::bf16) {
    model.init(static_cast<uint64_t>(seed));
    PlanOptions po = o1_plan(4);
    po.dtype = conv_dtype;
    po.fuse_conv_casts = fuse;
    po.memory = memory;
    Plan plan(model, backend.get(), po);
    const std::vector<std::string> names = plan.step_names();
    const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    if (fuse && memory == MemoryLevel::O0 && conv_dtype == DType::bf16) {
      EXPECT_EQ(plan.activation(b0).dtype, DType::f32) << "the residual reads it";
      EXPECT_EQ(plan.activation(b1).dtype, DType::bf16);
      EXPECT_EQ(plan.activation(b2).dtype, DType::bf16);
      EXPECT_EQ(plan.activation(b3).dtype, DType::f32);
      for (const int c : {c1, c2, c3}) EXPECT_EQ(plan.activation(c).dtype, DType::f32);
      EXPECT_TRUE(has("cast b0:y:bf16"));
      EXPECT_FALSE(has("cast b1:y:bf16"));
      EXPECT_FALSE(has("cast b2:y:bf16"));
      EXPECT_TRUE(has("bwd cast dc0")) << "b0's y is fp32, so with its ReLU its dx is too";
      for (const char* n : {"bwd cast dc1", "bwd cast dc2", "bwd cast dc3", "bwd cast db1:partial0"})
        EXPECT_FALSE(has(n)) << n;
      EXPECT_EQ(plan.activation_grad(c1).dtype, DType::bf16);
      EXPECT_EQ(plan.activation_grad(c3).dtype, DType::bf16);
      EXPECT_EQ(plan.activation_grad(b1).dtype, DType::bf16) << "c2 writes its dx in bf16 (its x is bf16)";
      EXPECT_EQ(plan.activation_grad(b0).dtype, DType::f32);
      int casts = 0;
      for (const std::string& n : names) casts += n.rfind("cast ", 0) == 0 || n.rfind("bwd cast ", 0) == 0;
      // The weights; forward the input and b0's y (to c0, c1), the pooled features (to fc)
      // and the logits (to the loss); backward dlogits (to fc), fc's dx (to the pooling) and dc0.
      EXPECT_EQ(casts, 8);
    }
    const std::vector<float> x =
        testing::random_values(static_cast<size_t>(plan.input().numel()), static_cast<uint32_t>(seed) + 100);
    convert(plan.input().data, plan.input().dtype, x.data(), DType::f32, x.size());
    for (int i = 0; i < 4; ++i) plan.labels().ptr<int32_t>()[i] = i;
    model.zero_grads();
    plan.forward();
    plan.backward(1.0f);
    return std::vector<float>(model.grad_data(), model.grad_data() + model.params().total);
  };
  // Against the fp32 plan's gradients: the fused plan rounds fewer values to bf16 (the
  // convolutions' outputs), so over a few initialisations it is the closer (measured on ten:
  // 0.034 to 0.051 relative, the unfused 0.032 to 0.056, the fused closer on eight).
  double fused_err = 0, plain_err = 0;
  for (seed = 1; seed <= 4; ++seed) {
    const std::vector<float> fused = grads(true, MemoryLevel::O0), plain = grads(false, MemoryLevel::O0);
    const std::vector<float> fp32 = grads(false, MemoryLevel::O0, DType::f32);
    fused_err += testing::conv_rel_error(fused, fp32);
    plain_err += testing::conv_rel_error(plain, fp32);
    EXPECT_LT(testing::conv_rel_error(fused, fp32), 0.1);
    EXPECT_GT(testing::conv_rel_error(fused, plain), 0) << "the same plan ran twice";
    EXPECT_EQ(grads(true, MemoryLevel::O2), fused) << "O2's recomputed bf16 outputs differ";
    EXPECT_EQ(grads(true, MemoryLevel::O1), fused);
  }
  std::printf("O1 gradients from fp32's, mean of 4 initialisations: fused %.4f, unfused %.4f\n", fused_err / 4,
              plain_err / 4);
  EXPECT_LT(fused_err, plain_err);

  // The evaluation plan (forward only, made for the validation pass) writes the same bf16
  // outputs; with the ReLU alone its descriptors carry half_dx too, which nothing reads.
  PlanOptions eval = o1_plan(4);
  eval.mode = PlanMode::eval;
  Plan ev(model, backend.get(), eval);
  EXPECT_EQ(ev.activation(b1).dtype, DType::bf16);
  EXPECT_EQ(ev.activation(b2).dtype, DType::bf16);
  const std::vector<float> x = testing::random_values(static_cast<size_t>(ev.input().numel()), 3);
  convert(ev.input().data, ev.input().dtype, x.data(), DType::f32, x.size());
  for (int i = 0; i < 4; ++i) ev.labels().ptr<int32_t>()[i] = i;
  ev.forward();
  EXPECT_TRUE(std::isfinite(ev.loss()));
}

// A convolution whose output another convolution reads keeps its bf16 output (an fp32 one
// would need a cast back); the one read by batch norm writes fp32. Both train.
TEST(CpuConvBf16, O1KeepsHalfOutputsThatAConvolutionReads) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  Graph g;
  g.name = "chain";
  const int a = g.conv(g.input(16, 8, 8), "a", 16, 1, 1, 0);
  const int b = g.conv(a, "b", 16, 3, 1, 1);
  g.linear(g.global_avg_pool(g.batch_norm(b, "bn", BnFuse::relu), "gap"), "fc", 3);
  Model model(std::move(g));
  model.init(2);
  auto backend = cpu(Arith::automatic);
  Plan plan(model, backend.get(), o1_plan(2));
  EXPECT_EQ(plan.activation(a).dtype, DType::bf16);
  EXPECT_EQ(plan.activation(b).dtype, DType::f32);
  for (const std::string& s : plan.step_names()) EXPECT_NE(s, "cast a:y:bf16") << "a's output cast back";
  const std::vector<float> x = testing::random_values(static_cast<size_t>(plan.input().numel()), 3);
  convert(plan.input().data, plan.input().dtype, x.data(), DType::f32, x.size());
  plan.labels().ptr<int32_t>()[0] = 0;
  plan.labels().ptr<int32_t>()[1] = 2;
  model.zero_grads();
  plan.forward();
  plan.backward(1.0f);
  EXPECT_TRUE(std::isfinite(plan.loss()));
  double norm = 0;
  for (int64_t i = 0; i < model.params().total; ++i) norm += std::abs(model.grad_data()[i]);
  EXPECT_GT(norm, 0);
  EXPECT_TRUE(std::isfinite(norm));
}

// A plan shows each conv node's arithmetic (the doctor's and the profile's source) and the
// linear layer's dtype; other nodes have none.
TEST(CpuConvBf16, PlanShowsEachConvolutionsArithmetic) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  Graph g;
  g.name = "arith";
  int x = g.input(16, 12, 12);
  const int wide = g.conv(x, "wide", 64, 3, 1, 1);  // 16 * 9 * 64 / 80 = 115 per element
  const int bn = g.batch_norm(wide, "bn", BnFuse::relu);
  const int narrow = g.conv(bn, "narrow", 64, 1, 1, 0);  // 64 * 64 / 128 = 32 per element
  x = g.global_avg_pool(narrow, "gap");
  const int fc = g.linear(x, "fc", 10);
  Model model(std::move(g));
  model.init(1);
  PlanOptions po;
  po.batch = 2;
  po.dtype = po.activation_dtype = DType::bf16;
  po.layout = Layout::nhwc;
  struct Expect {
    Arith arith;
    DType wide, narrow;
  };
  for (const Expect& e : {Expect{Arith::fp32, DType::f32, DType::f32}, Expect{Arith::native, DType::bf16, DType::bf16},
                          Expect{Arith::automatic, DType::f32, DType::bf16}}) {
    auto backend = cpu(e.arith, true, kSlowBf16);
    Plan plan(model, backend.get(), po);
    EXPECT_EQ(plan.arithmetic(wide), e.wide) << static_cast<int>(e.arith);
    EXPECT_EQ(plan.arithmetic(narrow), e.narrow) << static_cast<int>(e.arith);
    EXPECT_EQ(plan.arithmetic(fc), DType::bf16);
    EXPECT_EQ(plan.arithmetic(bn), std::nullopt);
  }
  PlanOptions fp32_po = po;
  fp32_po.dtype = fp32_po.activation_dtype = DType::f32;
  auto backend = cpu(Arith::fp32);
  EXPECT_EQ(Plan(model, backend.get(), fp32_po).arithmetic(wide), DType::f32);
  EXPECT_EQ(Plan(model, nullptr, po).arithmetic(wide), std::nullopt) << "a dry plan has no kernels";
}

using testing::ConvInputs;
using testing::ConvOutputs;
using testing::expect_conv_close;
using testing::random_conv_inputs;
using testing::run_conv;

TEST(CpuConvBf16, BothArithmeticsEqualTheFp32ConvolutionOfTheSameValues) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  struct Case {
    const char* name;
    Conv2dDesc d;
  };
  const Case cases[] = {
      // 89M multiply-adds, channels in 16s: Winograd in high_performance mode
      {"3x3 64->80 nhwc, bias", conv(64, 80, 3, 1, 4, 21, Layout::nhwc, DType::bf16, true)},
      {"3x3 64->80 nchw", conv(64, 80, 3, 1, 4, 21, Layout::nchw)},
      {"3x3 stride 2 48->40", conv(48, 40, 3, 2, 3, 19, Layout::nhwc)},
      {"1x1 stride 2 96->128, bias", conv(96, 128, 1, 2, 3, 15, Layout::nhwc, DType::bf16, true)},
      {"7x7 stride 2 3->64 (the stem)", conv(3, 64, 7, 2, 2, 32, Layout::nhwc)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Conv2dDesc& d = c.d;
    const ConvInputs in = random_conv_inputs(d, DType::bf16);
    Conv2dDesc d32 = d;
    d32.dtype = DType::f32;
    const ConvOutputs ref = run_conv(*cpu(Arith::automatic, /*winograd=*/false), d32, in);
    for (const bool fast : {true, false})
      for (const Arith a : {Arith::native, Arith::fp32}) {
        SCOPED_TRACE(std::string(a == Arith::fp32 ? "fp32 arithmetic" : "native bf16") +
                     (fast ? ", high_performance" : ", high_precision"));
        const ConvOutputs got = run_conv(*cpu(a, fast), d, in);
        // y and dx are rounded to bf16 once: an RMS relative error of about 1.7e-3 measured
        // (half an ulp of an 8-bit significand, uniformly spread); dw and db are fp32 sums of
        // the same exact products (1e-7, Winograd 1e-6). A misplaced element or a wrong
        // reorder is 1e-1 or more.
        expect_conv_close(got, ref, in, 3e-3, 1e-5, 1e-6);
      }
  }
}

// Precision O1's fused casts (Conv2dDesc::f32_y, f32_dx): y and dx come out in fp32, unrounded,
// so in both arithmetics they equal the fp32 convolution within fp32's bound (the same exact
// products summed in another order; Winograd 1e-6), where a bf16 rounding left anywhere on
// the way would show as 1e-3.
TEST(CpuConvBf16, Fp32OutputsAreTheUnroundedSums) {
  std::string why;
  if (!cpu_has_native_bf16(&why)) GTEST_SKIP() << why;
  const Conv2dDesc cases[] = {
      conv(64, 80, 3, 1, 4, 21, Layout::nhwc, DType::bf16, true),  // Winograd where widened
      conv(64, 80, 3, 1, 4, 21, Layout::nchw),
      conv(96, 128, 1, 2, 3, 15, Layout::nhwc, DType::bf16, true),
      conv(3, 64, 7, 2, 2, 32, Layout::nhwc),                         // the stem: widened in the caller's layout
      conv(32, 32, 3, 1, 2, 9, Layout::nhwc, DType::bf16, false, 4),  // grouped: always native
  };
  for (const Conv2dDesc& base : cases) {
    SCOPED_TRACE(base.str());
    const ConvInputs in = random_conv_inputs(base, DType::bf16);
    Conv2dDesc d32 = base;
    d32.dtype = DType::f32;
    const ConvOutputs ref = run_conv(*cpu(Arith::automatic, /*winograd=*/false), d32, in);
    Conv2dDesc d = base;
    d.f32_y = d.f32_dx = true;
    for (const bool fast : {true, false})
      for (const Arith a : {Arith::native, Arith::fp32}) {
        SCOPED_TRACE(std::string(a == Arith::fp32 ? "fp32 arithmetic" : "native bf16") +
                     (fast ? ", high_performance" : ", high_precision"));
        auto backend = cpu(a, fast);
        ASSERT_TRUE(backend->conv_f32_outputs());
        expect_conv_close(run_conv(*backend, d, in), ref, in, 1e-5, 1e-5, 1e-6);
        // The same kernel as the bf16-output convolution, not a slower one oneDNN found for
        // the fp32 destination (its reference kernels take any combination).
        EXPECT_EQ(backend->make_conv2d(d)->implementation(), backend->make_conv2d(base)->implementation());
      }
  }
}

TEST(CpuConvBf16, Fp32OutputsAreRefusedForAnFp32Convolution) {
  Conv2dDesc d = conv(8, 8, 3, 1, 1, 5, Layout::nhwc, DType::f32);
  d.f32_y = true;
  try {
    cpu(Arith::automatic)->make_conv2d(d);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 outputs are for a half-precision convolution"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rn

// The cpu backend's bf16 convolutions in their two arithmetics (backends/cpu/conv2d.cpp,
// CpuBackendOptions::bf16_conv_arithmetic): which one each shape gets, and that both equal
// the fp32 convolution of the same (bf16-representable) values within bf16's rounding of
// y and dx, and within the fp32 bound for dw and db, which are fp32 in both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
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

std::unique_ptr<Backend> cpu(Arith arith, bool winograd = true) {
  CpuBackendOptions o;
  o.bf16_conv_arithmetic = arith;
  o.winograd = winograd;
  return make_cpu_backend(o);
}

bool fp32_arithmetic(const Conv2dKernel& k) { return k.implementation().find("fp32 arithmetic") != std::string::npos; }
bool winograd(const Conv2dKernel& k) { return k.implementation().find("wino") != std::string::npos; }

bool bf16_here(std::string* why) { return cpu_has_native_bf16(why); }

TEST(CpuConvBf16, ArithmeticChosenPerShape) {
  std::string why;
  if (!bf16_here(&why)) GTEST_SKIP() << why;
  const Layout l = Layout::nhwc;
  // 3x3 64 -> 64: 288 multiply-adds per activation element; 1x1 64 -> 256: 51; 1x1 128 ->
  // 512: 102; the threshold is 96.
  const Conv2dDesc c3 = conv(64, 64, 3, 1, 4, 21, l), c1_low = conv(64, 256, 1, 1, 4, 21, l),
                   c1_high = conv(128, 512, 1, 1, 4, 21, l),
                   grouped = conv(128, 512, 1, 1, 4, 21, l, DType::bf16, false, /*groups=*/4);
  auto automatic = cpu(Arith::automatic), native = cpu(Arith::native), fp32 = cpu(Arith::fp32);
  if (cpu_has_amx()) {
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(c3))) << "AMX: oneDNN's bf16 kernels";
  } else {
    const auto k3 = automatic->make_conv2d(c3);
    EXPECT_TRUE(fp32_arithmetic(*k3)) << k3->implementation();
    EXPECT_EQ(winograd(*k3), cpu_has_winograd()) << k3->implementation();
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(c1_low))) << "51 per element: not worth the conversions";
    EXPECT_TRUE(fp32_arithmetic(*automatic->make_conv2d(c1_high))) << "102 per element";
    EXPECT_FALSE(fp32_arithmetic(*automatic->make_conv2d(grouped))) << "grouped: native";
    const auto precise = cpu(Arith::automatic, /*winograd=*/false)->make_conv2d(c3);
    EXPECT_TRUE(fp32_arithmetic(*precise));
    EXPECT_FALSE(winograd(*precise)) << "high_precision mode: direct, in either arithmetic";
  }
  for (const Conv2dDesc& d : {c3, c1_low, c1_high, grouped}) {
    const auto k = native->make_conv2d(d);
    EXPECT_FALSE(fp32_arithmetic(*k)) << d.str();
    EXPECT_NE(k->implementation().find("bf16"), std::string::npos) << k->implementation();
  }
  EXPECT_TRUE(fp32_arithmetic(*fp32->make_conv2d(c1_low))) << "asked for: every ungrouped shape";
  EXPECT_FALSE(fp32_arithmetic(*fp32->make_conv2d(grouped)));
  EXPECT_FALSE(fp32_arithmetic(*fp32->make_conv2d(conv(64, 64, 3, 1, 4, 21, l, DType::f32)))) << "fp32 tensors";
}

// Normal values rounded to bf16, so that the fp32 reference sees exactly the same inputs.
std::vector<float> random_bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = round_to_dtype(nd(rng), DType::bf16);
  return v;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

struct Outputs {
  std::vector<float> y, dx, dw, db;
};

HostTensor tensor_of(const std::vector<float>& v, const Shape& s, DType dtype, Layout layout) {
  HostTensor t(s, dtype, layout);
  convert(t.view().data, dtype, v.data(), DType::f32, v.size());
  return t;
}
std::vector<float> values_of(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(v.data(), DType::f32, t.view().data, t.view().dtype, v.size());
  return v;
}

// One forward and backward pass with x, w, dy in d.dtype; dw and db (fp32) start from dw0,
// db0 (gradients accumulate).
Outputs run(Backend& backend, const Conv2dDesc& d, const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& b, const std::vector<float>& dy, const std::vector<float>& dw0,
            const std::vector<float>& db0) {
  auto k = backend.make_conv2d(d);
  const HostTensor xt = tensor_of(x, d.x_shape(), d.dtype, d.layout),
                   wt = tensor_of(w, d.w_shape(), d.dtype, Layout::nchw);
  const HostTensor dyt = tensor_of(dy, d.y_shape(), d.dtype, d.layout),
                   bt = tensor_of(b, {d.p.out_channels}, DType::f32, Layout::nchw);
  const HostTensor dwt = tensor_of(dw0, d.w_shape(), DType::f32, Layout::nchw);
  const HostTensor dbt = tensor_of(db0, {d.p.out_channels}, DType::f32, Layout::nchw);
  const HostTensor yt(d.y_shape(), d.dtype, d.layout), dxt(d.x_shape(), d.dtype, d.layout);
  k->forward(yt, xt, wt, d.p.bias ? &bt.view() : nullptr);
  k->backward_data(dxt, dyt, wt);
  k->backward_weights(dwt, d.p.bias ? &dbt.view() : nullptr, dyt, xt);
  return Outputs{values_of(yt), values_of(dxt), values_of(dwt), values_of(dbt)};
}

TEST(CpuConvBf16, BothArithmeticsEqualTheFp32ConvolutionOfTheSameValues) {
  std::string why;
  if (!bf16_here(&why)) GTEST_SKIP() << why;
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
    const int64_t fan_in = d.p.in_channels * d.p.kernel_h * d.p.kernel_w;
    const auto x = random_bf16_values(static_cast<size_t>(d.x_shape().numel()), 1);
    const auto w = random_bf16_values(static_cast<size_t>(d.w_shape().numel()), 2, 1.0f / std::sqrt(float(fan_in)));
    const auto b = random_bf16_values(static_cast<size_t>(d.p.out_channels), 3);
    const auto dy = random_bf16_values(static_cast<size_t>(d.y_shape().numel()), 4);
    const auto dw0 = random_bf16_values(w.size(), 5), db0 = random_bf16_values(b.size(), 6);
    Conv2dDesc d32 = d;
    d32.dtype = DType::f32;
    const Outputs ref = run(*cpu(Arith::automatic, /*winograd=*/false), d32, x, w, b, dy, dw0, db0);
    for (const bool fast : {true, false})
      for (const Arith a : {Arith::native, Arith::fp32}) {
        SCOPED_TRACE(std::string(a == Arith::fp32 ? "fp32 arithmetic" : "native bf16") +
                     (fast ? ", high_performance" : ", high_precision"));
        const Outputs got = run(*cpu(a, fast), d, x, w, b, dy, dw0, db0);
        // y and dx are rounded to bf16 once: an RMS relative error of about 1.7e-3 measured
        // (half an ulp of an 8-bit significand, uniformly spread). A misplaced element or a
        // wrong reorder is 1e-1 or more.
        EXPECT_LT(rel_error(got.y, ref.y), 3e-3);
        EXPECT_LT(rel_error(got.dx, ref.dx), 3e-3);
        // dw, db: exact products of the same values summed in fp32 (Winograd: ~1e-6)
        EXPECT_LT(rel_error(got.dw, ref.dw), 1e-5);
        EXPECT_LT(rel_error(got.db, ref.db), 1e-6);
        EXPECT_GT(rel_error(got.dw, dw0), 1e-2) << "the gradient was accumulated into, not left alone";
      }
  }
}

}  // namespace
}  // namespace rn

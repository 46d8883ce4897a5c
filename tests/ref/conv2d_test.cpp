// Reference conv2d: forward against a direct 7-loop evaluation of the contract's formula
// and hand-computed values, gradients by finite differences, the gradient rule
// (dx overwritten, dw/db accumulate), and NCHW/NHWC equivalence.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, k, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
  bool bias;
};

const ConvCase kConvCases[] = {
    {"basic3x3", 2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"grouped", 2, 4, 6, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, false},
    {"depthwise_stride2", 2, 4, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, true},
    {"pointwise_stride2", 2, 6, 6, 6, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},
    {"dilated", 1, 3, 7, 6, 2, 3, 3, 1, 1, 2, 2, 2, 2, 1, true},
    {"odd_asymmetric_batch1", 1, 2, 7, 5, 3, 3, 2, 2, 1, 1, 0, 1, 1, 1, true},
    {"pointwise", 2, 5, 4, 3, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    {"stem7x7", 1, 3, 11, 9, 4, 7, 7, 2, 2, 3, 3, 1, 1, 1, false},
    {"group4_pointwise", 2, 8, 3, 3, 8, 1, 1, 1, 1, 0, 0, 1, 1, 4, true},
    {"grouped_dilated_multiplier", 1, 2, 5, 5, 4, 3, 3, 1, 1, 2, 2, 2, 2, 2, false},
    {"many_tiles", 1, 2, 20, 17, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
};

void PrintTo(const ConvCase& cc, std::ostream* os) { *os << cc.name; }

Conv2dDesc make_desc(const ConvCase& cc, Layout layout) {
  Conv2dDesc d;
  d.p.in_channels = cc.c, d.p.out_channels = cc.k, d.p.kernel_h = cc.r, d.p.kernel_w = cc.s;
  d.p.stride_h = cc.stride_h, d.p.stride_w = cc.stride_w, d.p.pad_h = cc.pad_h, d.p.pad_w = cc.pad_w;
  d.p.dilation_h = cc.dil_h, d.p.dilation_w = cc.dil_w, d.p.groups = cc.groups, d.p.bias = cc.bias;
  d.batch = cc.n, d.in_h = cc.h, d.in_w = cc.w, d.layout = layout;
  return d;
}

// y straight from the contract's formula, one output at a time, in fp64.
HostTensor naive_conv2d(const Conv2dDesc& d, const HostTensor& x, const HostTensor& w, const HostTensor* b) {
  HostTensor y(d.y_shape(), DType::f32, d.layout);
  const auto& p = d.p;
  const int64_t cg = p.in_channels / p.groups, kg = p.out_channels / p.groups;
  for (int64_t n = 0; n < d.batch; ++n)
    for (int64_t k = 0; k < p.out_channels; ++k)
      for (int64_t oh = 0; oh < d.out_h(); ++oh)
        for (int64_t ow = 0; ow < d.out_w(); ++ow) {
          double acc = b ? f32(*b)[k] : 0.0;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < p.kernel_h; ++r)
              for (int64_t s = 0; s < p.kernel_w; ++s) {
                const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
                if (ih < 0 || ih >= d.in_h || iw < 0 || iw >= d.in_w) continue;
                acc += static_cast<double>(f32(x)[x.view().offset(n, k / kg * cg + c, ih, iw)]) *
                       f32(w)[((k * cg + c) * p.kernel_h + r) * p.kernel_w + s];
              }
          f32(y)[y.view().offset(n, k, oh, ow)] = static_cast<float>(acc);
        }
  return y;
}

struct ConvFixture {
  Conv2dDesc d;
  std::unique_ptr<Conv2dKernel> conv;
  HostTensor x, w, b, y, r;

  ConvFixture(const Conv2dDesc& desc, uint64_t seed) : d(desc) {
    conv = make_ref_backend()->make_conv2d(d);
    Rng rng(seed);
    x = uniform_tensor(d.x_shape(), rng, -1.0f, 1.0f, d.layout);
    w = uniform_tensor(d.w_shape(), rng);
    b = uniform_tensor({d.p.out_channels}, rng);
    y = HostTensor(d.y_shape(), DType::f32, d.layout);
    r = uniform_tensor(d.y_shape(), rng, -1.0f, 1.0f, d.layout);
  }
  const Tensor* bias() const { return d.p.bias ? &b.view() : nullptr; }
  void forward() { conv->forward(y, x, w, bias()); }
  double objective() {
    forward();
    return weighted_sum(y, r);
  }
};

class RefConv2dCase : public ::testing::TestWithParam<std::tuple<ConvCase, Layout>> {};

TEST_P(RefConv2dCase, ForwardMatchesFormula) {
  const auto& [cc, layout] = GetParam();
  ConvFixture f(make_desc(cc, layout), 11);
  f.forward();
  const HostTensor expect = naive_conv2d(f.d, f.x, f.w, f.d.p.bias ? &f.b : nullptr);
  EXPECT_LT(max_rel_diff(f32(f.y), f32(expect), f.y.numel()), 1e-6) << f.d.str();
}

TEST_P(RefConv2dCase, GradientsMatchFiniteDifferences) {
  const auto& [cc, layout] = GetParam();
  ConvFixture f(make_desc(cc, layout), 23);
  HostTensor dx = filled_tensor(f.d.x_shape(), 0.0f, layout);
  HostTensor dw = filled_tensor(f.d.w_shape(), 0.0f);
  HostTensor db = filled_tensor({f.d.p.out_channels}, 0.0f);
  f.conv->backward_data(dx, f.r, f.w);
  f.conv->backward_weights(dw, f.d.p.bias ? &db.view() : nullptr, f.r, f.x);
  auto objective = [&] { return f.objective(); };
  RN_EXPECT_GRAD_OK(check_gradient(f.x, f32(dx), objective, 1), "dx " + f.d.str());
  RN_EXPECT_GRAD_OK(check_gradient(f.w, f32(dw), objective, 2), "dw " + f.d.str());
  if (f.d.p.bias) RN_EXPECT_GRAD_OK(check_gradient(f.b, f32(db), objective, 3), "db " + f.d.str());
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<ConvCase, Layout>>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::string(layout_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RefConv2dCase,
                         ::testing::Combine(::testing::ValuesIn(kConvCases),
                                            ::testing::Values(Layout::nchw, Layout::nhwc)),
                         case_name);

TEST(RefConv2d, HandComputedForward) {
  // x = [[1 2 3] [4 5 6] [7 8 9]], w = [[1 2] [3 4]], b = 0.5
  Conv2dDesc d;
  d.p.in_channels = 1, d.p.out_channels = 1, d.p.kernel_h = 2, d.p.kernel_w = 2, d.p.bias = true;
  d.in_h = 3, d.in_w = 3;
  HostTensor x({1, 1, 3, 3}, DType::f32), w({1, 1, 2, 2}, DType::f32);
  HostTensor b = filled_tensor({1}, 0.5f);
  for (int i = 0; i < 9; ++i) f32(x)[i] = static_cast<float>(i + 1);
  for (int i = 0; i < 4; ++i) f32(w)[i] = static_cast<float>(i + 1);
  {
    auto conv = make_ref_backend()->make_conv2d(d);
    HostTensor y(d.y_shape(), DType::f32);
    conv->forward(y, x, w, &b.view());
    const float expect[] = {37.5f, 47.5f, 67.5f, 77.5f};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f32(y)[i], expect[i]) << i;
  }
  {
    // Padding 1, stride 2: each window sees the zero border.
    d.p.pad_h = d.p.pad_w = 1, d.p.stride_h = d.p.stride_w = 2;
    auto conv = make_ref_backend()->make_conv2d(d);
    HostTensor y(d.y_shape(), DType::f32);
    ASSERT_EQ(y.view().shape, Shape({1, 1, 2, 2}));
    conv->forward(y, x, w, &b.view());
    const float expect[] = {4.5f, 18.5f, 36.5f, 77.5f};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f32(y)[i], expect[i]) << i;
  }
}

TEST(RefConv2d, GradientRule) {
  const Conv2dDesc d = make_desc(kConvCases[1], Layout::nchw);
  ConvFixture f(d, 5);
  f.d.p.bias = true;  // exercise db as well
  f.conv = make_ref_backend()->make_conv2d(f.d);
  // dx is overwritten: garbage in, the same answer out.
  HostTensor dx_clean = filled_tensor(d.x_shape(), 0.0f), dx_dirty = filled_tensor(d.x_shape(), 1e30f);
  f.conv->backward_data(dx_clean, f.r, f.w);
  f.conv->backward_data(dx_dirty, f.r, f.w);
  EXPECT_TRUE(all_equal(dx_dirty, dx_clean));
  // dw and db accumulate: two calls give exactly twice one.
  HostTensor dw1 = filled_tensor(d.w_shape(), 0.0f), db1 = filled_tensor({d.p.out_channels}, 0.0f);
  HostTensor dw2 = filled_tensor(d.w_shape(), 0.0f), db2 = filled_tensor({d.p.out_channels}, 0.0f);
  f.conv->backward_weights(dw1, &db1.view(), f.r, f.x);
  f.conv->backward_weights(dw2, &db2.view(), f.r, f.x);
  f.conv->backward_weights(dw2, &db2.view(), f.r, f.x);
  for (int64_t i = 0; i < dw1.numel(); ++i) EXPECT_EQ(f32(dw2)[i], 2.0f * f32(dw1)[i]) << i;
  for (int64_t i = 0; i < db1.numel(); ++i) EXPECT_EQ(f32(db2)[i], 2.0f * f32(db1)[i]) << i;
  // Accumulation is onto whatever is there.
  HostTensor dw3 = filled_tensor(d.w_shape(), 1.0f), db3 = filled_tensor({d.p.out_channels}, 1.0f);
  f.conv->backward_weights(dw3, &db3.view(), f.r, f.x);
  // (near, not equal: the sum is formed in fp64 before the single rounding)
  for (int64_t i = 0; i < dw1.numel(); ++i) EXPECT_NEAR(f32(dw3)[i], 1.0f + f32(dw1)[i], 1e-6) << i;
  for (int64_t i = 0; i < db1.numel(); ++i) EXPECT_NEAR(f32(db3)[i], 1.0f + f32(db1)[i], 1e-6) << i;
}

TEST(RefConv2d, LayoutsAgree) {
  for (const ConvCase& cc : kConvCases) {
    ConvFixture a(make_desc(cc, Layout::nchw), 99);
    ConvFixture b(make_desc(cc, Layout::nhwc), 99);
    b.x = to_layout(a.x, Layout::nhwc);
    b.r = to_layout(a.r, Layout::nhwc);
    b.w = copy_tensor(a.w);
    b.b = copy_tensor(a.b);
    a.forward();
    b.forward();
    // The summation order does not depend on the layout, so the results are identical.
    EXPECT_TRUE(all_equal(to_layout(b.y, Layout::nchw), a.y)) << cc.name << " y";
    HostTensor dxa = filled_tensor(a.d.x_shape(), 0.0f), dxb = filled_tensor(a.d.x_shape(), 0.0f, Layout::nhwc);
    a.conv->backward_data(dxa, a.r, a.w);
    b.conv->backward_data(dxb, b.r, b.w);
    EXPECT_TRUE(all_equal(to_layout(dxb, Layout::nchw), dxa)) << cc.name << " dx";
    HostTensor dwa = filled_tensor(a.d.w_shape(), 0.0f), dwb = filled_tensor(a.d.w_shape(), 0.0f);
    HostTensor dba = filled_tensor({cc.k}, 0.0f), dbb = filled_tensor({cc.k}, 0.0f);
    a.conv->backward_weights(dwa, cc.bias ? &dba.view() : nullptr, a.r, a.x);
    b.conv->backward_weights(dwb, cc.bias ? &dbb.view() : nullptr, b.r, b.x);
    EXPECT_TRUE(all_equal(dwb, dwa)) << cc.name << " dw";
    EXPECT_TRUE(all_equal(dbb, dba)) << cc.name << " db";
  }
}

TEST(RefConv2d, RejectsHalfTypes) {
  auto backend = make_ref_backend();
  for (DType t : {DType::bf16, DType::f16}) {
    Conv2dDesc d = make_desc(kConvCases[0], Layout::nchw);
    d.dtype = t;
    try {
      backend->make_conv2d(d);
      ADD_FAILURE() << "ref accepted " << dtype_name(t);
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
    }
  }
}

TEST(RefConv2d, InvalidDescriptorIsAnError) {
  Conv2dDesc d = make_desc(kConvCases[0], Layout::nchw);
  d.p.groups = 2;  // 3 input channels do not split into 2 groups
  EXPECT_THROW(make_ref_backend()->make_conv2d(d), Error);
}

// Not a pass/fail test: reports the rate on a ResNet-50 stage-1 3x3 layer (batch 1) so
// that a slowdown of the reference backend is visible in the test log.
TEST(RefConv2d, ReportsThroughput) {
  Conv2dDesc d;
  d.p.in_channels = 64, d.p.out_channels = 64, d.p.kernel_h = d.p.kernel_w = 3, d.p.pad_h = d.p.pad_w = 1;
  d.batch = 1, d.in_h = d.in_w = 56;
  ConvFixture f(d, 3);
  HostTensor dx(d.x_shape(), DType::f32), dw = filled_tensor(d.w_shape(), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  f.forward();
  const auto t1 = std::chrono::steady_clock::now();
  f.conv->backward_data(dx, f.r, f.w);
  const auto t2 = std::chrono::steady_clock::now();
  f.conv->backward_weights(dw, nullptr, f.r, f.x);
  const auto t3 = std::chrono::steady_clock::now();
  const double gflop = 2.0 * static_cast<double>(d.macs()) * 1e-9;
  auto rate = [&](auto a, auto b) { return gflop / std::chrono::duration<double>(b - a).count(); };
  std::printf("[ ref conv 64->64 3x3 56x56: forward %.2f, backward data %.2f, backward weights %.2f GFLOP/s ]\n",
              rate(t0, t1), rate(t1, t2), rate(t2, t3));
}

}  // namespace
}  // namespace rn::testing

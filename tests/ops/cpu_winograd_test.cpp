// The cpu backend's Winograd convolutions (backends/cpu/conv2d.cpp): taken in the
// high_performance mode for the shapes where they pay, never in high_precision mode, and
// equal to the direct convolution within the fp32 bound, forward and backward, with the
// activations reordered to and from oneDNN's blocked layout in both user layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "ops/backend.h"
#include "ops/conv2d.h"

namespace rn {
namespace {

// 3x3, stride 1, "same" padding; by default 4 images of 21x23 (partial 4x4 output tiles),
// 89M multiply-accumulates at 64 -> 80 channels: above the backend's 50M threshold.
Conv2dDesc desc3x3(int64_t c, int64_t k, Layout layout, bool bias = false, int64_t batch = 4, int64_t h = 21,
                   int64_t w = 23) {
  Conv2dDesc d;
  d.p.in_channels = c;
  d.p.out_channels = k;
  d.p.kernel_h = d.p.kernel_w = 3;
  d.p.pad_h = d.p.pad_w = 1;
  d.p.bias = bias;
  d.batch = batch;
  d.in_h = h;
  d.in_w = w;
  d.layout = layout;
  return d;
}

std::unique_ptr<Backend> cpu(bool winograd) {
  CpuBackendOptions o;
  o.winograd = winograd;
  return make_cpu_backend(o);
}

bool is_winograd(const Conv2dKernel& k) { return k.implementation().find("wino") != std::string::npos; }

// oneDNN's Winograd kernel needs AVX-512: elsewhere the backend falls back to direct. Asked
// of the CPU, not of the backend's choice, so that a regression in the choice fails here
// instead of skipping.
bool winograd_here() { return cpu_has_winograd(); }

TEST(CpuWinograd, TakenWhereItPaysAndNeverInHighPrecisionMode) {
  if (!winograd_here()) GTEST_SKIP() << "no Winograd kernel on this CPU (oneDNN's needs AVX-512)";
  auto fast = cpu(true), precise = cpu(false);
  EXPECT_TRUE(is_winograd(*fast->make_conv2d(desc3x3(64, 80, Layout::nhwc))));
  EXPECT_TRUE(is_winograd(*fast->make_conv2d(desc3x3(64, 64, Layout::nchw))));
  EXPECT_FALSE(is_winograd(*precise->make_conv2d(desc3x3(64, 64, Layout::nhwc)))) << "high_precision: direct";
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(desc3x3(16, 16, Layout::nhwc, false, 64, 28, 28))))
      << "16 channels (115M MACs): slower than direct";
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(desc3x3(32, 32, Layout::nhwc, false, 128, 14, 14))))
      << "32 channels (231M MACs, resnet20's middle stage): slower than direct";
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(desc3x3(48, 64, Layout::nhwc)))) << "48 input channels";
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(desc3x3(64, 64, Layout::nhwc, false, 1, 8, 8))))
      << "2.4M MACs: too small to pay for the fixed costs";
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(desc3x3(72, 64, Layout::nhwc)))) << "channels not in 16-blocks";
  Conv2dDesc strided = desc3x3(64, 64, Layout::nhwc);
  strided.p.stride_h = strided.p.stride_w = 2;
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(strided))) << "stride 2";
  Conv2dDesc one = desc3x3(64, 64, Layout::nhwc);
  one.p.kernel_h = one.p.kernel_w = 1;
  one.p.pad_h = one.p.pad_w = 0;
  EXPECT_FALSE(is_winograd(*fast->make_conv2d(one))) << "1x1";
}

std::vector<float> random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
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

// One forward and backward pass; dw and db start from `dw0` / `db0` (gradients accumulate).
Outputs run(Backend& backend, const Conv2dDesc& d, const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& b, const std::vector<float>& dy, const std::vector<float>& dw0,
            const std::vector<float>& db0) {
  auto k = backend.make_conv2d(d);
  Outputs o{std::vector<float>(static_cast<size_t>(d.y_shape().numel())),
            std::vector<float>(static_cast<size_t>(d.x_shape().numel())), dw0, db0};
  auto t = [&](const std::vector<float>& v, const Shape& s) {
    return Tensor{const_cast<float*>(v.data()), s, DType::f32, d.layout};
  };
  const Tensor bt{const_cast<float*>(b.data()), Shape{d.p.out_channels}, DType::f32, Layout::nchw};
  const Tensor dbt{o.db.data(), Shape{d.p.out_channels}, DType::f32, Layout::nchw};
  const Tensor wt{const_cast<float*>(w.data()), d.w_shape(), DType::f32, Layout::nchw};
  const Tensor dwt{o.dw.data(), d.w_shape(), DType::f32, Layout::nchw};
  k->forward(t(o.y, d.y_shape()), t(x, d.x_shape()), wt, d.p.bias ? &bt : nullptr);
  k->backward_data(t(o.dx, d.x_shape()), t(dy, d.y_shape()), wt);
  k->backward_weights(dwt, d.p.bias ? &dbt : nullptr, t(dy, d.y_shape()), t(x, d.x_shape()));
  return o;
}

TEST(CpuWinograd, EqualsTheDirectConvolutionWithinTheFp32Bound) {
  if (!winograd_here()) GTEST_SKIP() << "no Winograd kernel on this CPU (oneDNN's needs AVX-512)";
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    const Conv2dDesc d = desc3x3(64, 80, layout, /*bias=*/true);
    const auto x = random(static_cast<size_t>(d.x_shape().numel()), 1);
    const auto w = random(static_cast<size_t>(d.w_shape().numel()), 2, 1.0f / std::sqrt(9.0f * 64));
    const auto b = random(80, 3);
    const auto dy = random(static_cast<size_t>(d.y_shape().numel()), 4);
    const auto dw0 = random(w.size(), 5), db0 = random(80, 6);  // accumulated into
    auto fast = cpu(true), precise = cpu(false);
    ASSERT_TRUE(is_winograd(*fast->make_conv2d(d)));
    const Outputs wino = run(*fast, d, x, w, b, dy, dw0, db0), direct = run(*precise, d, x, w, b, dy, dw0, db0);
    SCOPED_TRACE(layout == Layout::nhwc ? "nhwc" : "nchw");
    // 1e-5: the cross-backend harness's fp32 bound. Measured here ~1e-6 for Winograd F(4x4,
    // 3x3) (direct: ~1e-7); a misplaced tile or a wrong reorder gives 1e-1 or more.
    EXPECT_LT(rel_error(wino.y, direct.y), 1e-5);
    EXPECT_LT(rel_error(wino.dx, direct.dx), 1e-5);
    EXPECT_LT(rel_error(wino.dw, direct.dw), 1e-5);
    EXPECT_LT(rel_error(wino.db, direct.db), 1e-6);
    EXPECT_GT(rel_error(direct.dw, dw0), 1e-2) << "the gradient was accumulated into, not left alone";
  }
}

}  // namespace
}  // namespace rn

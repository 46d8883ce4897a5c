// The cpu backend's Winograd convolutions (backends/cpu/conv2d.cpp): taken in the
// high_performance mode for the shapes where they pay, never in high_precision mode, and
// equal to the direct convolution within the fp32 bound, forward and backward, with the
// activations reordered to and from oneDNN's blocked layout in both user layouts.
#include <gtest/gtest.h>

#include <string>

#include "backends/cpu/cpu_backend.h"
#include "conv_test_util.h"
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

using testing::ConvInputs;
using testing::ConvOutputs;
using testing::expect_conv_close;
using testing::random_conv_inputs;
using testing::run_conv;

TEST(CpuWinograd, EqualsTheDirectConvolutionWithinTheFp32Bound) {
  if (!winograd_here()) GTEST_SKIP() << "no Winograd kernel on this CPU (oneDNN's needs AVX-512)";
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    const Conv2dDesc d = desc3x3(64, 80, layout, /*bias=*/true);
    const ConvInputs in = random_conv_inputs(d, DType::f32);
    auto fast = cpu(true), precise = cpu(false);
    ASSERT_TRUE(is_winograd(*fast->make_conv2d(d)));
    const ConvOutputs wino = run_conv(*fast, d, in), direct = run_conv(*precise, d, in);
    SCOPED_TRACE(layout == Layout::nhwc ? "nhwc" : "nchw");
    // 1e-5: the cross-backend harness's fp32 bound. Measured here ~1e-6 for Winograd F(4x4,
    // 3x3) (direct: ~1e-7); a misplaced tile or a wrong reorder gives 1e-1 or more.
    expect_conv_close(wino, direct, in, 1e-5, 1e-5, 1e-6);
  }
}

}  // namespace
}  // namespace rn

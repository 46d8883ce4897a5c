// Reference pooling: max pool forward against a direct evaluation, ties, workspace size,
// gradients by finite differences; global average pool values and gradients; layouts.
#include <gtest/gtest.h>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

struct PoolCase {
  int64_t n, c, h, w, kernel, stride, pad;
};

const PoolCase kPoolCases[] = {
    {2, 3, 7, 7, 3, 2, 1},  // the ResNet stem pool, odd input
    {1, 2, 6, 5, 2, 2, 0},
    {2, 2, 5, 6, 3, 1, 1},  // overlapping windows: one input can win several outputs
    {1, 1, 8, 8, 3, 2, 1},
};

void PrintTo(const PoolCase& pc, std::ostream* os) {
  *os << Shape{pc.n, pc.c, pc.h, pc.w}.str() << " k" << pc.kernel << " s" << pc.stride << " p" << pc.pad;
}

MaxPoolDesc make_desc(const PoolCase& pc, Layout layout) {
  MaxPoolDesc d;
  d.batch = pc.n, d.channels = pc.c, d.in_h = pc.h, d.in_w = pc.w;
  d.kernel = pc.kernel, d.stride = pc.stride, d.pad = pc.pad, d.layout = layout;
  return d;
}

// Distinct values 0.05 apart in random order: no step of the gradient check changes a winner.
HostTensor distinct_tensor(Shape shape, Layout layout, Rng& rng) {
  HostTensor t(shape, DType::f32, layout);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) f32(t)[i] = 0.05f * static_cast<float>(i - n / 2);
  for (int64_t i = n - 1; i > 0; --i) std::swap(f32(t)[i], f32(t)[rng.below(static_cast<uint64_t>(i + 1))]);
  return t;
}

struct MaxPoolFixture {
  MaxPoolDesc d;
  std::unique_ptr<MaxPoolKernel> pool;
  HostTensor x, y, r, ws;

  MaxPoolFixture(const MaxPoolDesc& desc, uint64_t seed) : d(desc) {
    pool = make_ref_backend()->make_max_pool(d);
    Rng rng(seed);
    x = distinct_tensor(d.x_shape(), d.layout, rng);
    y = HostTensor(d.y_shape(), DType::f32, d.layout);
    r = uniform_tensor(d.y_shape(), rng, -1.0f, 1.0f, d.layout);
    ws = HostTensor({static_cast<int64_t>(pool->workspace_bytes())}, DType::u8);
  }
  void forward() { pool->forward(y, ws, x); }
};

class RefMaxPoolCase : public ::testing::TestWithParam<std::tuple<PoolCase, Layout>> {};

TEST_P(RefMaxPoolCase, ForwardMatchesFormula) {
  const auto& [pc, layout] = GetParam();
  MaxPoolFixture f(make_desc(pc, layout), 5);
  EXPECT_EQ(f.pool->workspace_bytes(), static_cast<size_t>(f.d.y_shape().numel()) * 4);
  f.forward();
  const Tensor &xt = f.x.view(), &yt = f.y.view();
  for (int64_t n = 0; n < pc.n; ++n)
    for (int64_t c = 0; c < pc.c; ++c)
      for (int64_t p = 0; p < f.d.out_h(); ++p)
        for (int64_t q = 0; q < f.d.out_w(); ++q) {
          float best = -1e30f;
          for (int64_t r = 0; r < pc.kernel; ++r)
            for (int64_t s = 0; s < pc.kernel; ++s) {
              const int64_t ih = p * pc.stride - pc.pad + r, iw = q * pc.stride - pc.pad + s;
              if (ih >= 0 && ih < pc.h && iw >= 0 && iw < pc.w)
                best = std::max(best, f32(f.x)[xt.offset(n, c, ih, iw)]);
            }
          ASSERT_EQ(f32(f.y)[yt.offset(n, c, p, q)], best) << n << " " << c << " " << p << " " << q;
        }
}

TEST_P(RefMaxPoolCase, GradientMatchesFiniteDifferences) {
  const auto& [pc, layout] = GetParam();
  MaxPoolFixture f(make_desc(pc, layout), 7);
  f.forward();
  HostTensor dx = filled_tensor(f.d.x_shape(), 1e30f, layout);  // overwritten
  f.pool->backward(dx, f.r, f.ws);
  auto objective = [&] {
    f.forward();
    return weighted_sum(f.y, f.r);
  };
  // Sample every input so that inputs that win no window (gradient 0) are covered too.
  RN_EXPECT_GRAD_OK(check_gradient(f.x, f32(dx), objective, 1, kStep, 1000), "max_pool dx " + f.d.str());
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<PoolCase, Layout>>& info) {
  const PoolCase& p = std::get<0>(info.param);
  return "h" + std::to_string(p.h) + "w" + std::to_string(p.w) + "k" + std::to_string(p.kernel) + "s" +
         std::to_string(p.stride) + "p" + std::to_string(p.pad) + "_" +
         std::string(layout_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RefMaxPoolCase,
                         ::testing::Combine(::testing::ValuesIn(kPoolCases),
                                            ::testing::Values(Layout::nchw, Layout::nhwc)),
                         case_name);

TEST(RefMaxPool, TiesGoToTheFirstMaximumOfTheClippedWindow) {
  // 4x4 of ones, kernel 3, stride 2, pad 1: windows start at rows/cols -1 and 1, clipped
  // to [0, 2) and [1, 4); each output's gradient lands on its window's first valid element.
  MaxPoolDesc d = make_desc({1, 1, 4, 4, 3, 2, 1}, Layout::nchw);
  auto pool = make_ref_backend()->make_max_pool(d);
  HostTensor x = filled_tensor(d.x_shape(), 1.0f), y(d.y_shape(), DType::f32);
  HostTensor ws({static_cast<int64_t>(pool->workspace_bytes())}, DType::u8);
  pool->forward(y, ws, x);
  HostTensor dy(d.y_shape(), DType::f32), dx(d.x_shape(), DType::f32);
  for (int i = 0; i < 4; ++i) f32(dy)[i] = static_cast<float>(i + 1);
  pool->backward(dx, dy, ws);
  float expect[16] = {};
  expect[0 * 4 + 0] = 1, expect[0 * 4 + 1] = 2, expect[1 * 4 + 0] = 3, expect[1 * 4 + 1] = 4;
  for (int i = 0; i < 16; ++i) EXPECT_EQ(f32(dx)[i], expect[i]) << i;
}

TEST(RefMaxPool, OverlappingWinnersSumTheirGradients) {
  // One large value in the middle of a 3x3 input wins all four 2x2 stride-1 windows.
  MaxPoolDesc d = make_desc({1, 1, 3, 3, 2, 1, 0}, Layout::nchw);
  auto pool = make_ref_backend()->make_max_pool(d);
  HostTensor x = filled_tensor(d.x_shape(), 0.0f), y(d.y_shape(), DType::f32);
  f32(x)[4] = 5.0f;
  HostTensor ws({static_cast<int64_t>(pool->workspace_bytes())}, DType::u8);
  pool->forward(y, ws, x);
  HostTensor dy = filled_tensor(d.y_shape(), 0.25f), dx(d.x_shape(), DType::f32);
  pool->backward(dx, dy, ws);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(f32(dx)[i], i == 4 ? 1.0f : 0.0f) << i;
}

TEST(RefMaxPool, LayoutsAgree) {
  for (const PoolCase& pc : kPoolCases) {
    MaxPoolFixture a(make_desc(pc, Layout::nchw), 3), b(make_desc(pc, Layout::nhwc), 3);
    b.x = to_layout(a.x, Layout::nhwc), b.r = to_layout(a.r, Layout::nhwc);
    a.forward();
    b.forward();
    EXPECT_TRUE(all_equal(to_layout(b.y, Layout::nchw), a.y));
    HostTensor dxa(a.d.x_shape(), DType::f32), dxb(a.d.x_shape(), DType::f32, Layout::nhwc);
    a.pool->backward(dxa, a.r, a.ws);
    b.pool->backward(dxb, b.r, b.ws);
    EXPECT_TRUE(all_equal(to_layout(dxb, Layout::nchw), dxa));
  }
}

TEST(RefMaxPool, RejectsHalfTypes) {
  MaxPoolDesc d = make_desc(kPoolCases[0], Layout::nchw);
  d.dtype = DType::bf16;
  EXPECT_THROW(make_ref_backend()->make_max_pool(d), Unsupported);
}

GlobalAvgPoolDesc gap_desc(int64_t n, int64_t c, int64_t h, int64_t w, Layout layout) {
  GlobalAvgPoolDesc d;
  d.batch = n, d.channels = c, d.h = h, d.w = w, d.layout = layout;
  return d;
}

TEST(RefGlobalAvgPool, ForwardAndGradient) {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    const GlobalAvgPoolDesc d = gap_desc(2, 3, 5, 4, layout);
    auto pool = make_ref_backend()->make_global_avg_pool(d);
    Rng rng(21);
    HostTensor x = uniform_tensor(d.x_shape(), rng, -1.0f, 1.0f, layout), y(d.y_shape(), DType::f32);
    HostTensor r = uniform_tensor(d.y_shape(), rng);
    pool->forward(y, x);
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t c = 0; c < d.channels; ++c) {
        double sum = 0.0;
        for (int64_t h = 0; h < d.h; ++h)
          for (int64_t w = 0; w < d.w; ++w) sum += f32(x)[x.view().offset(n, c, h, w)];
        EXPECT_FLOAT_EQ(f32(y)[n * d.channels + c], static_cast<float>(sum / 20.0));
      }
    HostTensor dx = filled_tensor(d.x_shape(), 1e30f, layout);  // overwritten
    pool->backward(dx, r);
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t c = 0; c < d.channels; ++c)
        EXPECT_FLOAT_EQ(f32(dx)[dx.view().offset(n, c, 4, 3)], f32(r)[n * d.channels + c] / 20.0f);
    auto objective = [&] {
      pool->forward(y, x);
      return weighted_sum(y, r);
    };
    RN_EXPECT_GRAD_OK(check_gradient(x, f32(dx), objective, 1), "global_avg_pool dx " + d.str());
  }
}

TEST(RefGlobalAvgPool, RejectsHalfTypes) {
  GlobalAvgPoolDesc d = gap_desc(1, 2, 3, 3, Layout::nchw);
  d.dtype = DType::f16;
  EXPECT_THROW(make_ref_backend()->make_global_avg_pool(d), Unsupported);
}

}  // namespace
}  // namespace rn::testing

// Reference element-wise ops: relu forward and its gradient, add, and every cast.
#include <gtest/gtest.h>

#include <limits>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

EltwiseDesc eltwise(int64_t n) {
  EltwiseDesc d;
  d.numel = n;
  return d;
}

TEST(RefRelu, ForwardAndGradient) {
  const int64_t n = 300;
  auto relu = make_ref_backend()->make_relu(eltwise(n));
  Rng rng(3);
  // |x| >= 0.05, well beyond the step, so no difference straddles the kink.
  HostTensor x({n}, DType::f32), y({n}, DType::f32), r = uniform_tensor({n}, rng);
  for (int64_t i = 0; i < n; ++i) f32(x)[i] = (rng.uniform() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.05f, 1.0f);
  relu->forward(y, x);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32(y)[i], std::max(f32(x)[i], 0.0f)) << i;
  HostTensor dx = filled_tensor({n}, 1e30f);  // overwritten
  relu->backward(dx, r, y);
  auto objective = [&] {
    relu->forward(y, x);
    return weighted_sum(y, r);
  };
  RN_EXPECT_GRAD_OK(check_gradient(x, f32(dx), objective, 1, kStep, 64), "relu dx");
}

TEST(RefRelu, MaskIsStrictAndNaNPropagates) {
  auto relu = make_ref_backend()->make_relu(eltwise(4));
  HostTensor x({4}, DType::f32), y({4}, DType::f32), dy = filled_tensor({4}, 3.0f), dx({4}, DType::f32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float xv[] = {0.0f, -2.0f, 5.0f, nan};
  std::copy_n(xv, 4, f32(x));
  relu->forward(y, x);
  EXPECT_EQ(f32(y)[0], 0.0f);
  EXPECT_EQ(f32(y)[1], 0.0f);
  EXPECT_EQ(f32(y)[2], 5.0f);
  EXPECT_TRUE(std::isnan(f32(y)[3]));
  relu->backward(dx, dy, y);
  const float expect[] = {0.0f, 0.0f, 3.0f, 0.0f};  // y > 0 is the mask: false at 0 and NaN
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f32(dx)[i], expect[i]) << i;
}

TEST(RefRelu, InPlace) {
  const int64_t n = 100000;  // several parallel chunks
  auto relu = make_ref_backend()->make_relu(eltwise(n));
  Rng rng(5);
  HostTensor x = uniform_tensor({n}, rng), expect({n}, DType::f32);
  relu->forward(expect, x);
  relu->forward(x, x);
  EXPECT_TRUE(all_equal(x, expect));
}

TEST(RefAdd, Forward) {
  const int64_t n = 70000;
  auto add = make_ref_backend()->make_add(eltwise(n));
  Rng rng(7);
  HostTensor a = uniform_tensor({n}, rng), b = uniform_tensor({n}, rng), y({n}, DType::f32);
  add->forward(y, a, b);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32(y)[i], f32(a)[i] + f32(b)[i]) << i;
}

TEST(RefEltwise, RejectsHalfTypes) {
  auto backend = make_ref_backend();
  EltwiseDesc d = eltwise(8);
  d.dtype = DType::bf16;
  EXPECT_THROW(backend->make_relu(d), Unsupported);
  EXPECT_THROW(backend->make_add(d), Unsupported);
  d.dtype = DType::f16;
  EXPECT_THROW(backend->make_relu(d), Unsupported);
}

// Every conversion among fp32, bf16 and fp16 matches core/dtype.h's rounding.
TEST(RefCast, AllFloatConversions) {
  const int64_t n = 40000;
  Rng rng(9);
  std::vector<float> values(static_cast<size_t>(n));
  for (auto& v : values) v = rng.normal() * 100.0f;
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  for (DType src : types) {
    for (DType dst : types) {
      CastDesc d;
      d.numel = n, d.src = src, d.dst = dst;
      auto cast = make_ref_backend()->make_cast(d);
      HostTensor x({n}, src), y({n}, dst), back({n}, DType::f32);
      convert(x.view().data, src, values.data(), DType::f32, static_cast<size_t>(n));
      cast->forward(y, x);
      convert(back.view().data, DType::f32, y.view().data, dst, static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float expect = round_to_dtype(round_to_dtype(values[static_cast<size_t>(i)], src), dst);
        ASSERT_EQ(f32(back)[i], expect) << dtype_name(src) << "->" << dtype_name(dst) << " at " << i;
      }
    }
  }
}

TEST(RefCast, InPlaceNarrowing) {
  // f32 -> bf16 into the same buffer: sizes differ, so the kernel must not read what it
  // has already overwritten.
  const int64_t n = 50000;
  Rng rng(11);
  HostTensor buf = uniform_tensor({n}, rng, -10.0f, 10.0f);
  std::vector<float> orig(f32(buf), f32(buf) + n);
  CastDesc d;
  d.numel = n, d.src = DType::f32, d.dst = DType::bf16;
  Tensor y = buf.view();
  y.dtype = DType::bf16;
  make_ref_backend()->make_cast(d)->forward(y, buf);
  const auto* h = static_cast<const bf16_t*>(y.data);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bf16_to_f32(h[i]), round_to_dtype(orig[static_cast<size_t>(i)], DType::bf16)) << i;
}

}  // namespace
}  // namespace rn::testing

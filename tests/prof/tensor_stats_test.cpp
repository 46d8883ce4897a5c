// Tensor statistics and half-precision ranges against values worked out by hand, and the
// analytic underflow/overflow counts against core's own fp16/bf16 rounding.
#include "prof/tensor_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/check.h"

namespace rn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(TensorStats, HandComputedSmallTensor) {
  const std::vector<float> x = {0.0f, 3.0f, -4.0f, kInf, kNaN, 1e-12f, 2e5f, 0.5f};
  const TensorStats s = tensor_stats(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(s.numel, 8);
  EXPECT_EQ(s.zeros, 1);
  EXPECT_EQ(s.infs, 1);
  EXPECT_EQ(s.nans, 1);
  const double sum_sq = 9.0 + 16.0 + double(1e-12f) * double(1e-12f) + 4e10 + 0.25;
  EXPECT_DOUBLE_EQ(s.sum_sq, sum_sq);
  EXPECT_DOUBLE_EQ(s.norm(), std::sqrt(sum_sq));
  EXPECT_DOUBLE_EQ(s.max_abs, 2e5);
  EXPECT_DOUBLE_EQ(s.min_abs_nonzero, double(1e-12f));
  EXPECT_DOUBLE_EQ(s.fraction(s.zeros), 0.125);
  // Decade bins: 1e-12 below 1e-10 (bin 0); 0.5 in [0.1, 1) (bin 10); 3 and 4 in [1, 10)
  // (bin 11); 2e5 at or above 1e4 (bin 15).
  std::array<int64_t, TensorStats::kBins> expected{};
  expected[0] = 1;
  expected[10] = 1;
  expected[11] = 2;
  expected[15] = 1;
  EXPECT_EQ(s.hist, expected);
}

TEST(TensorStats, MultiplierUnscales) {
  const std::vector<float> x = {2.0f, -4.0f, 0.5f};
  const TensorStats s = tensor_stats(x.data(), 3, 0.5);  // as if the loss scale were 2
  EXPECT_DOUBLE_EQ(s.norm(), std::sqrt(1.0 + 4.0 + 0.0625));
  EXPECT_DOUBLE_EQ(s.max_abs, 2.0);
  EXPECT_EQ(s.hist[10], 1);  // 0.25
  EXPECT_EQ(s.hist[11], 2);  // 1, 2
}

TEST(TensorStats, BinEdgesAreExactDecades) {
  EXPECT_EQ(tensor_stats_bin(9.99e-11), 0);
  EXPECT_EQ(tensor_stats_bin(1e-10), 1);
  EXPECT_EQ(tensor_stats_bin(0.1), 10);
  EXPECT_EQ(tensor_stats_bin(0.0999999), 9);
  EXPECT_EQ(tensor_stats_bin(1.0), 11);
  EXPECT_EQ(tensor_stats_bin(9999.0), 14);
  EXPECT_EQ(tensor_stats_bin(1e4), 15);
  EXPECT_EQ(tensor_stats_bin(1e30), 15);
  EXPECT_DOUBLE_EQ(tensor_stats_bin_lower(1), 1e-10);
  EXPECT_DOUBLE_EQ(tensor_stats_bin_lower(0), 0.0);
}

TEST(TensorStats, AddIsTheStatsOfTheConcatenation) {
  const std::vector<float> a = {1.0f, 0.0f, -3e-11f}, b = {kNaN, 7.0f};
  std::vector<float> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  TensorStats s = tensor_stats(a.data(), 3);
  s.add(tensor_stats(b.data(), 2));
  const TensorStats t = tensor_stats(ab.data(), 5);
  EXPECT_EQ(s.numel, t.numel);
  EXPECT_EQ(s.zeros, t.zeros);
  EXPECT_EQ(s.nans, t.nans);
  EXPECT_DOUBLE_EQ(s.sum_sq, t.sum_sq);
  EXPECT_EQ(s.hist, t.hist);
  EXPECT_DOUBLE_EQ(s.min_abs_nonzero, t.min_abs_nonzero);
}

TEST(DistanceNorm, HandComputed) {
  const std::vector<float> a = {3.0f, 4.0f}, b = {4.0f, 8.0f};
  const DistanceNorm d = distance_norm(a.data(), b.data(), 2, 0.5);  // a - b/2 = {1, 0}
  EXPECT_DOUBLE_EQ(d.distance, 1.0);
  EXPECT_DOUBLE_EQ(d.norm_a, 5.0);
  EXPECT_DOUBLE_EQ(d.relative(), 0.2);
}

TEST(HalfRange, Fp16LimitsHandPicked) {
  // 2^-25 is half the smallest fp16 subnormal: a tie, rounds to even (0). 65520 is 65504
  // plus half an ulp (32): a tie, rounds to infinity.
  const std::vector<float> x = {std::ldexp(1.0f, -25), std::ldexp(1.0f, -24), 65519.0f, 65520.0f, 0.0f};
  HalfRangeCounts c = half_range_counts(x.data(), 5, 1.0, DType::f16);
  EXPECT_EQ(c.nonzero, 4);
  EXPECT_EQ(c.underflow, 1);
  EXPECT_EQ(c.overflow, 1);
  EXPECT_DOUBLE_EQ(c.underflow_fraction(), 0.2);
  c = half_range_counts(x.data(), 5, 2.0, DType::f16);
  EXPECT_EQ(c.underflow, 0);
  EXPECT_EQ(c.overflow, 2);
}

// The analytic counts equal what core's round-to-nearest-even conversion does.
TEST(HalfRange, MatchesCoreRounding) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> exponent(-45.0f, 30.0f);
  std::vector<float> x(20000);
  for (float& v : x) v = std::exp2(exponent(gen)) * ((gen() & 1) ? 1.0f : -1.0f);
  for (DType half : {DType::f16, DType::bf16}) {
    for (int e : {-40, -10, 0, 7, 20, 100}) {
      const float scale = std::ldexp(1.0f, e);
      int64_t under = 0, over = 0;
      for (float v : x) {
        const float r = round_to_dtype(v * scale, half);
        under += r == 0.0f;
        over += std::isinf(r);
      }
      const HalfRangeCounts c = half_range_counts(x.data(), static_cast<int64_t>(x.size()), scale, half);
      EXPECT_EQ(c.underflow, under) << dtype_name(half) << " scale 2^" << e;
      EXPECT_EQ(c.overflow, over) << dtype_name(half) << " scale 2^" << e;
    }
  }
}

TEST(SafeScaleRange, HandComputed) {
  const std::vector<float> x = {1e-3f, 1e-6f, 1.0f, 0.0f};
  const ScaleRange r = safe_scale_range(x.data(), 4, DType::f16, 0.0);
  // lo: 1e-6 * 2^m must exceed 2^-25 ~ 2.98e-8: 2^-5 = 0.03125 > 0.0298, 2^-6 is not.
  EXPECT_DOUBLE_EQ(r.lo, std::ldexp(1.0, -5));
  // hi: 1.0 * 2^k below 65520: 2^15.
  EXPECT_DOUBLE_EQ(r.hi, std::ldexp(1.0, 15));
  EXPECT_EQ(half_range_counts(x.data(), 4, r.lo, DType::f16).underflow, 0);
  EXPECT_EQ(half_range_counts(x.data(), 4, r.lo / 2, DType::f16).underflow, 1);
  EXPECT_EQ(half_range_counts(x.data(), 4, r.hi, DType::f16).overflow, 0);
  EXPECT_EQ(half_range_counts(x.data(), 4, r.hi * 2, DType::f16).overflow, 1);
  // A third of the values may underflow: the second smallest (1e-3) sets lo.
  const ScaleRange t = safe_scale_range(x.data(), 4, DType::f16, 0.34);
  EXPECT_LT(t.lo, r.lo);
  EXPECT_EQ(half_range_counts(x.data(), 4, t.lo, DType::f16).underflow, 1);
  const double rec = recommended_scale(r);
  EXPECT_GE(rec, r.lo);
  EXPECT_LE(rec, r.hi);
  EXPECT_TRUE(std::isnan(recommended_scale({4.0, 2.0})));
  const std::vector<float> zeros(3, 0.0f);
  EXPECT_TRUE(safe_scale_range(zeros.data(), 3, DType::f16, 0.0).hi > 1e300);
}

TEST(HalfRange, RejectsNonHalfDtype) {
  const float x = 1.0f;
  EXPECT_THROW(half_range_counts(&x, 1, 1.0, DType::f32), Error);
}

}  // namespace
}  // namespace rn

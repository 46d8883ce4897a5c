// Statistics of one fp32 tensor, for the gradient-distribution monitor (train/grad_monitor.h)
// and the precision doctor (train/doctor.h):
//
//   TensorStats s = tensor_stats(grad, n, 1.0 / loss_scale);   // unscaled gradient statistics
//   s.norm(), s.max_abs, s.fraction(s.zeros), s.hist[...]
//
// The histogram has fixed logarithmic bins of |x| (decades), so histograms of different
// tensors, steps and runs line up bin for bin:
//   bin 0        0 < |x| < 1e-10
//   bin i        1e(i-11) <= |x| < 1e(i-10), i = 1 .. 14
//   bin 15       |x| >= 1e4
// Zeros, infinities and NaNs are counted apart and are in no bin.
//
// Half-precision range: which values of `scale * x` round to zero (underflow) or to
// infinity (overflow) when stored in fp16 or bf16 with round-to-nearest-even, computed
// from the fp32 values, and the range of power-of-two scales that avoids both.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace rn {

struct TensorStats {
  static constexpr int kBins = 16;
  int64_t numel = 0;
  int64_t zeros = 0, infs = 0, nans = 0;
  double sum_sq = 0;           // over finite values
  double max_abs = 0;          // over finite values
  double min_abs_nonzero = 0;  // over finite non-zero values; 0 when there is none
  std::array<int64_t, kBins> hist{};

  double norm() const;
  double fraction(int64_t count) const {
    return numel > 0 ? static_cast<double>(count) / static_cast<double>(numel) : 0;
  }
  void add(const TensorStats& o);  // as if the two tensors were one
  nlohmann::json to_json() const;
};

// The lower edge of histogram bin `bin` (0 for bin 0).
double tensor_stats_bin_lower(int bin);
// The bin of a finite, non-zero magnitude.
int tensor_stats_bin(double abs_value);

// Statistics of multiplier * x[i], i < n (the multiplier unscales gradients).
TensorStats tensor_stats(const float* x, int64_t n, double multiplier = 1.0);

// ||a - multiplier * b|| and ||a|| in one pass, in double.
struct DistanceNorm {
  double distance = 0, norm_a = 0;
  double relative() const;  // distance / norm_a; 0 when both are 0, inf when only norm_a is
};
DistanceNorm distance_norm(const float* a, const float* b, int64_t n, double b_multiplier = 1.0);

// Counts of scale * x[i] that a `half` dtype (f16 or bf16) cannot hold.
struct HalfRangeCounts {
  int64_t numel = 0;
  int64_t nonzero = 0;                // finite non-zero x
  int64_t underflow = 0;              // non-zero x whose scaled value rounds to 0
  int64_t overflow = 0;               // finite x whose scaled value rounds to infinity
  double underflow_fraction() const;  // of all numel
  double overflow_fraction() const;
};
HalfRangeCounts half_range_counts(const float* x, int64_t n, double scale, DType half);

// The magnitudes at which a scaled value leaves the range of `half`: below underflow_limit
// it rounds to 0 (half the smallest subnormal), at or above overflow_limit to infinity
// (the largest finite value plus half an ulp).
struct HalfLimits {
  double underflow_limit = 0, overflow_limit = 0;
};
HalfLimits half_limits(DType half);

// Power-of-two loss scales for which the scaled x fits `half`: `lo` is the smallest scale at
// which at most `underflow_tolerance` of the non-zero values underflow, `hi` the largest at
// which none overflows. A tensor of zeros gives lo = 0 and hi = inf (any scale).
struct ScaleRange {
  double lo = 0, hi = 0;
  bool empty() const { return lo > hi; }
};
ScaleRange safe_scale_range(const float* x, int64_t n, DType half, double underflow_tolerance);
// Intersection of ranges (every tensor must fit).
ScaleRange intersect(const ScaleRange& a, const ScaleRange& b);
// The power of two in the middle of [lo, hi] on a log scale (clamped to [2^-24, 2^24] when
// the range is unbounded); NaN for an empty range.
double recommended_scale(const ScaleRange& r);

}  // namespace rn

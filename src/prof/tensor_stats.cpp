#include "prof/tensor_stats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace rn {

namespace {
constexpr int kFirstDecade = -10;  // the lower edge of bin 1 is 1e-10
}

double TensorStats::norm() const { return std::sqrt(sum_sq); }

void TensorStats::add(const TensorStats& o) {
  numel += o.numel;
  zeros += o.zeros;
  infs += o.infs;
  nans += o.nans;
  sum_sq += o.sum_sq;
  max_abs = std::max(max_abs, o.max_abs);
  if (o.min_abs_nonzero > 0 && (min_abs_nonzero == 0 || o.min_abs_nonzero < min_abs_nonzero))
    min_abs_nonzero = o.min_abs_nonzero;
  for (int b = 0; b < kBins; ++b) hist[b] += o.hist[b];
}

nlohmann::json TensorStats::to_json() const {
  return {{"numel", numel},
          {"zeros", zeros},
          {"infs", infs},
          {"nans", nans},
          {"norm", norm()},
          {"max_abs", max_abs},
          {"min_abs_nonzero", min_abs_nonzero},
          {"hist", hist}};
}

namespace {
// The bins' lower edges, 0 then 1e-10, 1e-9, ...: computed once, as the gradient monitor bins
// every value of every tensor (instead of a log10 and up to a few pow calls per value).
const std::array<double, TensorStats::kBins>& bin_edges() {
  static const std::array<double, TensorStats::kBins> edges = [] {
    std::array<double, TensorStats::kBins> e{};
    for (int b = 1; b < TensorStats::kBins; ++b) e[static_cast<size_t>(b)] = std::pow(10.0, kFirstDecade + b - 1);
    return e;
  }();
  return edges;
}
}  // namespace

double tensor_stats_bin_lower(int bin) {
  RN_CHECK(bin >= 0 && bin < TensorStats::kBins) << "histogram bin " << bin << " out of range";
  return bin_edges()[static_cast<size_t>(bin)];
}

// The last bin whose lower edge is at most `a` (bin 0 for anything below 1e-10).
int tensor_stats_bin(double a) {
  const auto& e = bin_edges();
  return static_cast<int>(std::upper_bound(e.begin() + 1, e.end(), a) - e.begin()) - 1;
}

TensorStats tensor_stats(const float* x, int64_t n, double multiplier) {
  TensorStats s;
  s.numel = n;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]) * multiplier;
    if (std::isnan(v)) {
      ++s.nans;
    } else if (std::isinf(v)) {
      ++s.infs;
    } else if (v == 0) {
      ++s.zeros;
    } else {
      const double a = std::fabs(v);
      s.sum_sq += a * a;
      s.max_abs = std::max(s.max_abs, a);
      if (s.min_abs_nonzero == 0 || a < s.min_abs_nonzero) s.min_abs_nonzero = a;
      ++s.hist[static_cast<size_t>(tensor_stats_bin(a))];
    }
  }
  return s;
}

double DistanceNorm::relative() const {
  if (norm_a == 0) return distance == 0 ? 0 : std::numeric_limits<double>::infinity();
  return distance / norm_a;
}

DistanceNorm distance_norm(const float* a, const float* b, int64_t n, double b_multiplier) {
  double d2 = 0, a2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b_multiplier * static_cast<double>(b[i]);
    d2 += d * d;
    a2 += static_cast<double>(a[i]) * a[i];
  }
  return {std::sqrt(d2), std::sqrt(a2)};
}

HalfLimits half_limits(DType half) {
  switch (half) {
    // fp16: smallest subnormal 2^-24, largest finite 65504 with an ulp of 32 there.
    case DType::f16:
      return {std::ldexp(1.0, -25), 65504.0 + 16.0};
    // bf16: smallest subnormal 2^-133, largest finite (2 - 2^-7) * 2^127 with an ulp of 2^120.
    case DType::bf16:
      return {std::ldexp(1.0, -134), (2.0 - std::ldexp(1.0, -7)) * std::ldexp(1.0, 127) + std::ldexp(1.0, 119)};
    default:
      RN_FAIL() << "half-precision range: " << dtype_name(half) << " is not a half dtype (fp16 or bf16)";
  }
}

double HalfRangeCounts::underflow_fraction() const {
  return numel > 0 ? static_cast<double>(underflow) / static_cast<double>(numel) : 0;
}
double HalfRangeCounts::overflow_fraction() const {
  return numel > 0 ? static_cast<double>(overflow) / static_cast<double>(numel) : 0;
}

HalfRangeCounts half_range_counts(const float* x, int64_t n, double scale, DType half) {
  const HalfLimits lim = half_limits(half);
  HalfRangeCounts c;
  c.numel = n;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || x[i] == 0) continue;
    ++c.nonzero;
    const double v = std::fabs(static_cast<double>(x[i]) * scale);
    if (v <= lim.underflow_limit) ++c.underflow;  // a tie rounds to even: to 0
    if (v >= lim.overflow_limit) ++c.overflow;    // a tie rounds to even: to infinity
  }
  return c;
}

ScaleRange safe_scale_range(const float* x, int64_t n, DType half, double underflow_tolerance) {
  const HalfLimits lim = half_limits(half);
  std::vector<double> mags;
  double max_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || x[i] == 0) continue;
    const double a = std::fabs(static_cast<double>(x[i]));
    mags.push_back(a);
    max_abs = std::max(max_abs, a);
  }
  ScaleRange r{0, std::numeric_limits<double>::infinity()};
  if (mags.empty()) return r;
  // hi: the largest 2^k with max_abs * 2^k below the overflow limit.
  int k = static_cast<int>(std::floor(std::log2(lim.overflow_limit / max_abs)));
  while (max_abs * std::ldexp(1.0, k) >= lim.overflow_limit) --k;
  while (max_abs * std::ldexp(1.0, k + 1) < lim.overflow_limit) ++k;
  r.hi = std::ldexp(1.0, k);
  // lo: the smallest 2^m that lifts the value at the tolerated quantile above the limit;
  // only the (at most tolerance * nonzero) values below it may underflow.
  const auto idx = static_cast<size_t>(std::floor(underflow_tolerance * static_cast<double>(mags.size())));
  if (idx >= mags.size()) return r;
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(idx), mags.end());
  const double q = mags[idx];
  int m = static_cast<int>(std::floor(std::log2(lim.underflow_limit / q))) + 1;
  while (q * std::ldexp(1.0, m - 1) > lim.underflow_limit) --m;
  while (q * std::ldexp(1.0, m) <= lim.underflow_limit) ++m;
  r.lo = std::ldexp(1.0, m);
  return r;
}

ScaleRange intersect(const ScaleRange& a, const ScaleRange& b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

double recommended_scale(const ScaleRange& r) {
  if (r.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double lo = std::log2(std::max(r.lo, std::ldexp(1.0, -24)));
  const double hi = std::log2(std::min(r.hi, std::ldexp(1.0, 24)));
  if (lo > hi)
    return std::ldexp(1.0,
                      static_cast<int>(std::round(r.lo > std::ldexp(1.0, 24) ? std::log2(r.lo) : std::log2(r.hi))));
  return std::ldexp(1.0, static_cast<int>(std::floor((lo + hi) / 2)));
}

}  // namespace rn

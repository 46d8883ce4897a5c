// Helpers shared by the reference-backend tests: random host tensors, layout conversion
// and one finite-difference gradient checker.
//
// Gradient check method: a scalar objective L = sum_i y_i R_i (fp64) with a fixed random
// R, so that dL/dy = R is what backward receives as dy. For a sample of input
// coordinates, the numeric derivative is the central difference (L(v+h) - L(v-h)) /
// (fl(v+h) - fl(v-h)) (the step actually taken in fp32), and the result is compared
// norm-wise: ||analytic - numeric|| / ||numeric|| < kGradTol over the sample.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "backends/ref/ref_backend.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace rn::testing {

// fp32 central differences with h = 1e-2 on O(1) values are accurate to about 1e-5
// (measured well below 1e-4 on every case here), while a wrong gradient formula is off
// by 1e-2 or more: one tolerance for every check.
constexpr double kGradTol = 1e-3;
constexpr float kStep = 1e-2f;
constexpr int kSamples = 24;  // coordinates checked per tensor (all of them if fewer)

inline float* f32(const HostTensor& t) { return t.ptr<float>(); }

inline HostTensor uniform_tensor(Shape shape, Rng& rng, float lo = -1.0f, float hi = 1.0f,
                                 Layout layout = Layout::nchw) {
  HostTensor t(shape, DType::f32, layout);
  for (int64_t i = 0; i < t.numel(); ++i) f32(t)[i] = rng.uniform(lo, hi);
  return t;
}

inline HostTensor filled_tensor(Shape shape, float value, Layout layout = Layout::nchw) {
  HostTensor t(shape, DType::f32, layout);
  std::fill_n(f32(t), t.numel(), value);
  return t;
}

inline HostTensor copy_tensor(const HostTensor& src) {
  HostTensor t(src.view().shape, src.view().dtype, src.view().layout);
  std::copy_n(static_cast<const char*>(src.view().data), src.view().bytes(), static_cast<char*>(t.view().data));
  return t;
}

// The same logical 4-D fp32 tensor in another memory layout.
inline HostTensor to_layout(const HostTensor& src, Layout layout) {
  const Tensor& s = src.view();
  HostTensor t(s.shape, DType::f32, layout);
  const Tensor& d = t.view();
  for (int64_t n = 0; n < s.shape[0]; ++n)
    for (int64_t c = 0; c < s.shape[1]; ++c)
      for (int64_t h = 0; h < s.shape[2]; ++h)
        for (int64_t w = 0; w < s.shape[3]; ++w) f32(t)[d.offset(n, c, h, w)] = f32(src)[s.offset(n, c, h, w)];
  return t;
}

// sum_i y_i r_i in fp64, over memory order (y and r share shape and layout).
inline double weighted_sum(const HostTensor& y, const HostTensor& r) {
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(f32(y)[i]) * f32(r)[i];
  return s;
}

// Exact element-wise equality, reporting the first mismatch.
inline ::testing::AssertionResult all_equal(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel()) return ::testing::AssertionFailure() << "sizes differ";
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (f32(a)[i] != f32(b)[i]) {
      return ::testing::AssertionFailure() << "element " << i << ": " << f32(a)[i] << " vs " << f32(b)[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// max |a - b| / max(1, |b|) over all elements.
inline double max_rel_diff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  }
  return m;
}

struct GradCheck {
  double rel_error = 0.0;  // ||analytic - numeric|| / ||numeric|| over the sampled coordinates
  double numeric_norm = 0.0;
  int checked = 0;
  std::string worst;  // the worst coordinate, for failure messages
};

// Perturbs `input` (fp32, any shape) coordinate by coordinate, evaluating `objective`
// (which must recompute the op's output from the current inputs), and compares the
// central differences with `analytic` (same element order as `input`).
inline GradCheck check_gradient(const HostTensor& input, const float* analytic,
                                const std::function<double()>& objective, uint64_t seed, float step = kStep,
                                int samples = kSamples) {
  const int64_t n = input.numel();
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(idx[static_cast<size_t>(i)], idx[rng.below(static_cast<uint64_t>(i + 1))]);
  idx.resize(static_cast<size_t>(std::min<int64_t>(n, samples)));

  GradCheck r;
  double diff2 = 0.0, num2 = 0.0, worst = -1.0;
  float* v = f32(input);
  for (int64_t i : idx) {
    const float v0 = v[i];
    const float up = v0 + step, down = v0 - step;
    v[i] = up;
    const double l_up = objective();
    v[i] = down;
    const double l_down = objective();
    v[i] = v0;
    const double numeric = (l_up - l_down) / (static_cast<double>(up) - down);
    const double d = analytic[i] - numeric;
    diff2 += d * d;
    num2 += numeric * numeric;
    if (std::abs(d) > worst) {
      worst = std::abs(d);
      r.worst = "index " + std::to_string(i) + ": analytic " + std::to_string(analytic[i]) + " numeric " +
                std::to_string(numeric);
    }
    ++r.checked;
  }
  objective();  // leave the op's outputs as they were for the unperturbed inputs
  r.numeric_norm = std::sqrt(num2);
  r.rel_error = num2 > 0.0 ? std::sqrt(diff2 / num2) : std::sqrt(diff2);
  return r;
}

// EXPECT-style wrapper: the check passes when the relative error is below kGradTol and
// the numeric gradient is not trivially zero.
#define RN_EXPECT_GRAD_OK(result, what)                                                                   \
  do {                                                                                                    \
    const ::rn::testing::GradCheck& _r = (result);                                                        \
    EXPECT_GT(_r.numeric_norm, 1e-3) << (what) << ": numeric gradient is zero, the check proves nothing"; \
    EXPECT_LT(_r.rel_error, ::rn::testing::kGradTol)                                                      \
        << (what) << ": gradient mismatch over " << _r.checked << " coordinates; worst " << _r.worst;     \
  } while (0)

}  // namespace rn::testing

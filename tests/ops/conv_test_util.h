// One forward and backward pass of a convolution on float vectors, for the tests that
// compare two implementations of the same convolution on the same values
// (cpu_winograd_test.cpp, cpu_conv_bf16_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/conv2d.h"

namespace rn::testing {

// Normal values, rounded to `dtype` so that a wider type sees exactly the same inputs.
inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f, DType dtype = DType::f32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = round_to_dtype(nd(rng), dtype);
  return v;
}

// ||a - b|| / ||b|| over whole tensors.
inline double conv_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

struct ConvOutputs {
  std::vector<float> y, dx, dw, db;
};

inline HostTensor tensor_of(const std::vector<float>& v, const Shape& s, DType dtype, Layout layout) {
  HostTensor t(s, dtype, layout);
  convert(t.view().data, dtype, v.data(), DType::f32, v.size());
  return t;
}
inline std::vector<float> values_of(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(v.data(), DType::f32, t.view().data, t.view().dtype, v.size());
  return v;
}

// A convolution's inputs: x, w (scaled by 1/sqrt(fan-in)), bias, dy, and the gradients dw0,
// db0 that the backward pass accumulates into; every value rounded to `dtype`.
struct ConvInputs {
  std::vector<float> x, w, b, dy, dw0, db0;
};
inline ConvInputs random_conv_inputs(const Conv2dDesc& d, DType dtype) {
  const auto fan_in = static_cast<float>(d.p.in_channels / d.p.groups * d.p.kernel_h * d.p.kernel_w);
  const auto n = [](const Shape& s) { return static_cast<size_t>(s.numel()); };
  const size_t k = static_cast<size_t>(d.p.out_channels);
  return ConvInputs{random_values(n(d.x_shape()), 1, 1.0f, dtype),
                    random_values(n(d.w_shape()), 2, 1.0f / std::sqrt(fan_in), dtype),
                    random_values(k, 3, 1.0f, dtype),
                    random_values(n(d.y_shape()), 4, 1.0f, dtype),
                    random_values(n(d.w_shape()), 5, 1.0f, dtype),
                    random_values(k, 6, 1.0f, dtype)};
}

// forward, backward_data, backward_weights with x, w, dy in d.dtype (d.layout; w in OIHW),
// y in d.y_dtype(), dx in d.dx_dtype(); dw and db (fp32) start from dw0, db0, as gradients accumulate.
inline ConvOutputs run_conv(Backend& backend, const Conv2dDesc& d, const ConvInputs& in) {
  const auto& [x, w, b, dy, dw0, db0] = in;
  auto k = backend.make_conv2d(d);
  const HostTensor xt = tensor_of(x, d.x_shape(), d.dtype, d.layout);
  const HostTensor wt = tensor_of(w, d.w_shape(), d.dtype, Layout::nchw);
  const HostTensor dyt = tensor_of(dy, d.y_shape(), d.dtype, d.layout);
  const HostTensor bt = tensor_of(b, {d.p.out_channels}, DType::f32, Layout::nchw);
  const HostTensor dwt = tensor_of(dw0, d.w_shape(), DType::f32, Layout::nchw);
  const HostTensor dbt = tensor_of(db0, {d.p.out_channels}, DType::f32, Layout::nchw);
  const HostTensor yt(d.y_shape(), d.y_dtype(), d.layout), dxt(d.x_shape(), d.dx_dtype(), d.layout);
  k->forward(yt, xt, wt, d.p.bias ? &bt.view() : nullptr);
  k->backward_data(dxt, dyt, wt);
  k->backward_weights(dwt, d.p.bias ? &dbt.view() : nullptr, dyt, xt);
  return ConvOutputs{values_of(yt), values_of(dxt), values_of(dwt), values_of(dbt)};
}

// got against want: y and dx within `activations`, dw within `dw`, db within `db` (relative
// errors over whole tensors), and dw really accumulated into dw0.
inline void expect_conv_close(const ConvOutputs& got, const ConvOutputs& want, const ConvInputs& in, double activations,
                              double dw, double db) {
  EXPECT_LT(conv_rel_error(got.y, want.y), activations);
  EXPECT_LT(conv_rel_error(got.dx, want.dx), activations);
  EXPECT_LT(conv_rel_error(got.dw, want.dw), dw);
  EXPECT_LT(conv_rel_error(got.db, want.db), db);
  EXPECT_GT(conv_rel_error(got.dw, in.dw0), 1e-2) << "the gradient was accumulated into, not left alone";
}

}  // namespace rn::testing

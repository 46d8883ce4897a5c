// Reference linear layer: forward values, gradients by finite differences, gradient rule.
#include <gtest/gtest.h>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

struct LinearFixture {
  LinearDesc d;
  std::unique_ptr<LinearKernel> fc;
  HostTensor x, w, b, y, r;

  LinearFixture(int64_t n, int64_t in, int64_t out, bool bias, uint64_t seed) {
    d.batch = n, d.in_features = in, d.out_features = out, d.bias = bias;
    fc = make_ref_backend()->make_linear(d);
    Rng rng(seed);
    x = uniform_tensor(d.x_shape(), rng);
    w = uniform_tensor(d.w_shape(), rng);
    b = uniform_tensor({out}, rng);
    y = HostTensor(d.y_shape(), DType::f32);
    r = uniform_tensor(d.y_shape(), rng);
  }
  const Tensor* bias() const { return d.bias ? &b.view() : nullptr; }
  double objective() {
    fc->forward(y, x, w, bias());
    return weighted_sum(y, r);
  }
};

TEST(RefLinear, ForwardMatchesFormula) {
  LinearFixture f(3, 301, 7, true, 1);  // more than one column tile, rows not a multiple of 4
  f.fc->forward(f.y, f.x, f.w, f.bias());
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t o = 0; o < 7; ++o) {
      double acc = f32(f.b)[o];
      for (int64_t i = 0; i < 301; ++i) acc += static_cast<double>(f32(f.x)[n * 301 + i]) * f32(f.w)[o * 301 + i];
      EXPECT_FLOAT_EQ(f32(f.y)[n * 7 + o], static_cast<float>(acc)) << n << " " << o;
    }
}

TEST(RefLinear, GradientsMatchFiniteDifferences) {
  struct Case {
    int64_t n, in, out;
    bool bias;
  };
  for (const Case& c : {Case{2, 9, 5, true}, Case{5, 300, 3, false}, Case{1, 4, 10, true}}) {
    LinearFixture f(c.n, c.in, c.out, c.bias, 3);
    HostTensor dx = filled_tensor(f.d.x_shape(), 1e30f);  // overwritten
    HostTensor dw = filled_tensor(f.d.w_shape(), 0.0f), db = filled_tensor({c.out}, 0.0f);
    f.fc->backward_data(dx, f.r, f.w);
    f.fc->backward_weights(dw, c.bias ? &db.view() : nullptr, f.r, f.x);
    auto objective = [&] { return f.objective(); };
    RN_EXPECT_GRAD_OK(check_gradient(f.x, f32(dx), objective, 1), "dx " + f.d.str());
    RN_EXPECT_GRAD_OK(check_gradient(f.w, f32(dw), objective, 2), "dw " + f.d.str());
    if (c.bias) RN_EXPECT_GRAD_OK(check_gradient(f.b, f32(db), objective, 3), "db " + f.d.str());
  }
}

TEST(RefLinear, ParameterGradientsAccumulate) {
  LinearFixture f(4, 6, 5, true, 9);
  HostTensor dw1 = filled_tensor(f.d.w_shape(), 0.0f), db1 = filled_tensor({5}, 0.0f);
  HostTensor dw2 = filled_tensor(f.d.w_shape(), 0.0f), db2 = filled_tensor({5}, 0.0f);
  f.fc->backward_weights(dw1, &db1.view(), f.r, f.x);
  f.fc->backward_weights(dw2, &db2.view(), f.r, f.x);
  f.fc->backward_weights(dw2, &db2.view(), f.r, f.x);
  for (int64_t i = 0; i < dw1.numel(); ++i) EXPECT_EQ(f32(dw2)[i], 2.0f * f32(dw1)[i]) << i;
  for (int64_t i = 0; i < db1.numel(); ++i) EXPECT_EQ(f32(db2)[i], 2.0f * f32(db1)[i]) << i;
}

TEST(RefLinear, RejectsHalfTypes) {
  LinearDesc d;
  d.dtype = DType::bf16;
  EXPECT_THROW(make_ref_backend()->make_linear(d), Unsupported);
}

}  // namespace
}  // namespace rn::testing

// Reference batch norm: training gradients by finite differences for every fuse mode,
// forward values, the PyTorch running-stat update, inference, the gradient rule and
// NCHW/NHWC equivalence.
#include <gtest/gtest.h>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

struct BnCase {
  int64_t n, c, h, w;
  BnFuse fuse;
  Layout layout;
};

void PrintTo(const BnCase& bc, std::ostream* os) {
  *os << bn_fuse_name(bc.fuse) << " " << layout_name(bc.layout) << " " << Shape{bc.n, bc.c, bc.h, bc.w}.str();
}

BatchNormDesc make_desc(const BnCase& bc) {
  BatchNormDesc d;
  d.batch = bc.n, d.channels = bc.c, d.h = bc.h, d.w = bc.w, d.fuse = bc.fuse, d.layout = bc.layout;
  return d;
}

// Per-channel xhat = (x - mean) / sqrt(var + eps) in fp64, by element offset.
std::vector<double> normalized(const BatchNormDesc& d, const HostTensor& x) {
  std::vector<double> xhat(static_cast<size_t>(x.numel()));
  const Tensor& t = x.view();
  for (int64_t c = 0; c < d.channels; ++c) {
    double sum = 0.0, sq = 0.0;
    const double m = static_cast<double>(d.batch * d.h * d.w);
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) sum += f32(x)[t.offset(n, c, h, w)];
    const double mean = sum / m;
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) sq += std::pow(f32(x)[t.offset(n, c, h, w)] - mean, 2);
    const double invstd = 1.0 / std::sqrt(sq / m + d.eps);
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) {
          const int64_t i = t.offset(n, c, h, w);
          xhat[static_cast<size_t>(i)] = (f32(x)[i] - mean) * invstd;
        }
  }
  return xhat;
}

struct BnFixture {
  BatchNormDesc d;
  std::unique_ptr<BatchNormKernel> bn;
  HostTensor x, residual, gamma, beta, y, r, saved_mean, saved_invstd, running_mean, running_var;

  BnFixture(const BatchNormDesc& desc, uint64_t seed) : d(desc) {
    bn = make_ref_backend()->make_batch_norm(d);
    Rng rng(seed);
    const Shape xs = d.x_shape(), cs = {d.channels};
    // Bimodal x (|x| in [0.4, 1.5]) so that every channel's xhat has a wide gap near its middle.
    x = HostTensor(xs, DType::f32, d.layout);
    for (int64_t i = 0; i < x.numel(); ++i) f32(x)[i] = (rng.uniform() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.4f, 1.5f);
    gamma = uniform_tensor(cs, rng, 0.5f, 1.5f);
    beta = uniform_tensor(cs, rng, -0.5f, 0.5f);
    residual = HostTensor(xs, DType::f32, d.layout);
    y = HostTensor(xs, DType::f32, d.layout);
    r = uniform_tensor(xs, rng, -1.0f, 1.0f, d.layout);
    saved_mean = HostTensor(cs, DType::f32);
    saved_invstd = HostTensor(cs, DType::f32);
    running_mean = filled_tensor(cs, 0.0f);
    running_var = filled_tensor(cs, 1.0f);
    keep_relu_inputs_away_from_zero(rng);
  }

  // The fused ReLU has a kink at z = 0. For relu, beta moves each channel's threshold into
  // the widest gap of its xhat; for add_relu, the residual puts every z at +-[0.3, 1].
  // Then no step of the gradient check moves any z across 0 (asserted by the caller via
  // min_margin()).
  void keep_relu_inputs_away_from_zero(Rng& rng) {
    if (d.fuse == BnFuse::none) return;
    const std::vector<double> xhat = normalized(d, x);
    const Tensor& t = x.view();
    for (int64_t c = 0; c < d.channels; ++c) {
      std::vector<double> v;
      for (int64_t n = 0; n < d.batch; ++n)
        for (int64_t h = 0; h < d.h; ++h)
          for (int64_t w = 0; w < d.w; ++w) v.push_back(xhat[static_cast<size_t>(t.offset(n, c, h, w))]);
      if (d.fuse == BnFuse::relu) {
        std::sort(v.begin(), v.end());
        double best_gap = -1.0, mid = 0.0;
        for (size_t i = 1; i < v.size(); ++i) {
          if (v[i] - v[i - 1] > best_gap) best_gap = v[i] - v[i - 1], mid = 0.5 * (v[i] + v[i - 1]);
        }
        f32(beta)[c] = static_cast<float>(-f32(gamma)[c] * mid);
      } else {
        for (int64_t n = 0; n < d.batch; ++n)
          for (int64_t h = 0; h < d.h; ++h)
            for (int64_t w = 0; w < d.w; ++w) {
              const int64_t i = t.offset(n, c, h, w);
              const double bn = f32(gamma)[c] * xhat[static_cast<size_t>(i)] + f32(beta)[c];
              const double z = (rng.uniform() < 0.5f ? -1.0 : 1.0) * rng.uniform(0.3f, 1.0f);
              f32(residual)[i] = static_cast<float>(z - bn);
            }
      }
    }
  }

  // min |z| over all elements, z being the input of the fused ReLU.
  double min_margin() const {
    const std::vector<double> xhat = normalized(d, x);
    double m = 1e30;
    const Tensor& t = x.view();
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t c = 0; c < d.channels; ++c)
        for (int64_t h = 0; h < d.h; ++h)
          for (int64_t w = 0; w < d.w; ++w) {
            const int64_t i = t.offset(n, c, h, w);
            double z = f32(gamma)[c] * xhat[static_cast<size_t>(i)] + f32(beta)[c];
            if (d.fuse == BnFuse::add_relu) z += f32(residual)[i];
            m = std::min(m, std::abs(z));
          }
    return m;
  }

  const Tensor* res() const { return d.fuse == BnFuse::add_relu ? &residual.view() : nullptr; }
  void forward() {
    bn->forward_training(y, saved_mean, saved_invstd, x, res(), gamma, beta, running_mean, running_var);
  }
  double objective() {
    forward();
    return weighted_sum(y, r);
  }
};

class RefBatchNormCase : public ::testing::TestWithParam<BnCase> {};

TEST_P(RefBatchNormCase, ForwardMatchesFormula) {
  BnFixture f(make_desc(GetParam()), 7);
  f.forward();
  const std::vector<double> xhat = normalized(f.d, f.x);
  const Tensor& t = f.x.view();
  for (int64_t n = 0; n < f.d.batch; ++n)
    for (int64_t c = 0; c < f.d.channels; ++c)
      for (int64_t h = 0; h < f.d.h; ++h)
        for (int64_t w = 0; w < f.d.w; ++w) {
          const int64_t i = t.offset(n, c, h, w);
          double z = f32(f.gamma)[c] * xhat[static_cast<size_t>(i)] + f32(f.beta)[c];
          if (f.d.fuse == BnFuse::add_relu) z += f32(f.residual)[i];
          if (f.d.fuse != BnFuse::none) z = std::max(z, 0.0);
          ASSERT_NEAR(f32(f.y)[i], z, 1e-6 * std::max(1.0, std::abs(z))) << f.d.str() << " at " << i;
        }
}

TEST_P(RefBatchNormCase, GradientsMatchFiniteDifferences) {
  BnFixture f(make_desc(GetParam()), 31);
  // One step moves a z by at most about gamma * invstd * h (x), h (residual, beta) or
  // |xhat| * h (gamma): with gamma <= 1.5, invstd <= 2.5 and |xhat| <= 4 here, below 4 h.
  // Keep a further factor of 4 between that and the nearest z to the kink.
  if (f.d.fuse != BnFuse::none) {
    ASSERT_GT(f.min_margin(), 4 * 4 * kStep) << "test inputs too close to the kink";
  }
  const Shape xs = f.d.x_shape(), cs = {f.d.channels};
  HostTensor dx = filled_tensor(xs, 0.0f, f.d.layout), dres = filled_tensor(xs, 0.0f, f.d.layout);
  HostTensor dgamma = filled_tensor(cs, 0.0f), dbeta = filled_tensor(cs, 0.0f);
  f.forward();
  f.bn->backward(dx, f.res() ? &dres.view() : nullptr, dgamma, dbeta, f.r, f.x, f.y, f.gamma, f.saved_mean,
                 f.saved_invstd);
  auto objective = [&] { return f.objective(); };
  const std::string what = f.d.str();
  RN_EXPECT_GRAD_OK(check_gradient(f.x, f32(dx), objective, 1), "dx " + what);
  RN_EXPECT_GRAD_OK(check_gradient(f.gamma, f32(dgamma), objective, 2), "dgamma " + what);
  RN_EXPECT_GRAD_OK(check_gradient(f.beta, f32(dbeta), objective, 3), "dbeta " + what);
  if (f.res()) RN_EXPECT_GRAD_OK(check_gradient(f.residual, f32(dres), objective, 4), "dresidual " + what);
}

std::vector<BnCase> bn_cases() {
  std::vector<BnCase> cases;
  for (BnFuse fuse : {BnFuse::none, BnFuse::relu, BnFuse::add_relu}) {
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      cases.push_back({2, 3, 3, 4, fuse, layout});
      cases.push_back({1, 2, 5, 3, fuse, layout});  // batch 1, odd sizes
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<BnCase>& info) {
  const BnCase& c = info.param;
  return std::string(bn_fuse_name(c.fuse)) + "_" + std::string(layout_name(c.layout)) + "_n" + std::to_string(c.n) +
         "c" + std::to_string(c.c) + "h" + std::to_string(c.h) + "w" + std::to_string(c.w);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RefBatchNormCase, ::testing::ValuesIn(bn_cases()), case_name);

TEST(RefBatchNorm, RunningStatsFollowPyTorch) {
  // One channel, values 1, 2, 3, 6: mean 3, biased var 3.5, unbiased var 14/3.
  BatchNormDesc d;
  d.batch = 2, d.channels = 1, d.h = 1, d.w = 2, d.momentum = 0.25f, d.eps = 1e-3f;
  auto bn = make_ref_backend()->make_batch_norm(d);
  HostTensor x(d.x_shape(), DType::f32), y(d.x_shape(), DType::f32);
  const float xv[] = {1, 2, 3, 6};
  std::copy_n(xv, 4, f32(x));
  HostTensor gamma = filled_tensor({1}, 2.0f), beta = filled_tensor({1}, 0.5f);
  HostTensor mean({1}, DType::f32), invstd({1}, DType::f32);
  HostTensor rm = filled_tensor({1}, 1.0f), rv = filled_tensor({1}, 2.0f);
  bn->forward_training(y, mean, invstd, x, nullptr, gamma, beta, rm, rv);
  EXPECT_FLOAT_EQ(f32(mean)[0], 3.0f);
  EXPECT_FLOAT_EQ(f32(invstd)[0], static_cast<float>(1.0 / std::sqrt(3.5 + 1e-3)));
  EXPECT_FLOAT_EQ(f32(rm)[0], 0.75f * 1.0f + 0.25f * 3.0f);
  EXPECT_FLOAT_EQ(f32(rv)[0], static_cast<float>(0.75 * 2.0 + 0.25 * 14.0 / 3.0));
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(f32(y)[i], static_cast<float>(2.0 * (xv[i] - 3.0) / std::sqrt(3.5 + 1e-3) + 0.5)) << i;
  }
  // A second step moves the running stats again from where they are.
  bn->forward_training(y, mean, invstd, x, nullptr, gamma, beta, rm, rv);
  EXPECT_FLOAT_EQ(f32(rm)[0], 0.75f * 1.5f + 0.25f * 3.0f);
}

TEST(RefBatchNorm, TrainingNeedsMoreThanOneValue) {
  BatchNormDesc d;
  d.channels = 2;  // N = H = W = 1
  auto bn = make_ref_backend()->make_batch_norm(d);
  HostTensor x(d.x_shape(), DType::f32), y(d.x_shape(), DType::f32), s1({2}, DType::f32), s2({2}, DType::f32);
  HostTensor g = filled_tensor({2}, 1.0f), b({2}, DType::f32), rm({2}, DType::f32), rv = filled_tensor({2}, 1.0f);
  EXPECT_THROW(bn->forward_training(y, s1, s2, x, nullptr, g, b, rm, rv), Error);
  EXPECT_NO_THROW(bn->forward_inference(y, x, nullptr, g, b, rm, rv));
}

TEST(RefBatchNorm, InferenceUsesRunningStats) {
  for (BnFuse fuse : {BnFuse::none, BnFuse::relu, BnFuse::add_relu}) {
    BatchNormDesc d;
    d.batch = 1, d.channels = 2, d.h = 1, d.w = 2, d.fuse = fuse, d.eps = 0.0625f;
    auto bn = make_ref_backend()->make_batch_norm(d);
    HostTensor x(d.x_shape(), DType::f32), y(d.x_shape(), DType::f32), res(d.x_shape(), DType::f32);
    const float xv[] = {1, -3, 2, 10}, resv[] = {0.5f, 0.5f, -4, -4};
    std::copy_n(xv, 4, f32(x));
    std::copy_n(resv, 4, f32(res));
    HostTensor gamma({2}, DType::f32), beta({2}, DType::f32), rm({2}, DType::f32), rv({2}, DType::f32);
    f32(gamma)[0] = 2, f32(gamma)[1] = -1, f32(beta)[0] = 1, f32(beta)[1] = 0;
    f32(rm)[0] = -1, f32(rm)[1] = 2, f32(rv)[0] = 4 - 0.0625f, f32(rv)[1] = 0.25f - 0.0625f;  // std 2 and 0.5
    bn->forward_inference(y, x, fuse == BnFuse::add_relu ? &res.view() : nullptr, gamma, beta, rm, rv);
    // channel 0: 2 (x + 1) / 2 + 1; channel 1: -(x - 2) / 0.5
    float expect[] = {3, -1, 0, -16};
    for (int i = 0; i < 4; ++i) {
      if (fuse == BnFuse::add_relu) expect[i] += resv[i];
      if (fuse != BnFuse::none) expect[i] = std::max(expect[i], 0.0f);
      EXPECT_FLOAT_EQ(f32(y)[i], expect[i]) << bn_fuse_name(fuse) << " " << i;
    }
  }
}

TEST(RefBatchNorm, GradientRule) {
  BnFixture f(make_desc({2, 3, 2, 3, BnFuse::add_relu, Layout::nchw}), 13);
  f.forward();
  const Shape xs = f.d.x_shape(), cs = {f.d.channels};
  auto run = [&](HostTensor& dx, HostTensor& dres, HostTensor& dg, HostTensor& db) {
    f.bn->backward(dx, &dres.view(), dg, db, f.r, f.x, f.y, f.gamma, f.saved_mean, f.saved_invstd);
  };
  HostTensor dx1 = filled_tensor(xs, 0.0f), dr1 = filled_tensor(xs, 0.0f);
  HostTensor dg1 = filled_tensor(cs, 0.0f), db1 = filled_tensor(cs, 0.0f);
  run(dx1, dr1, dg1, db1);
  HostTensor dx2 = filled_tensor(xs, 1e30f), dr2 = filled_tensor(xs, -7.0f);
  HostTensor dg2 = filled_tensor(cs, 0.0f), db2 = filled_tensor(cs, 0.0f);
  run(dx2, dr2, dg2, db2);
  run(dx2, dr2, dg2, db2);
  EXPECT_TRUE(all_equal(dx2, dx1)) << "dx is overwritten";
  EXPECT_TRUE(all_equal(dr2, dr1)) << "dresidual is overwritten";
  for (int64_t c = 0; c < f.d.channels; ++c) {
    EXPECT_EQ(f32(dg2)[c], 2.0f * f32(dg1)[c]) << "dgamma accumulates";
    EXPECT_EQ(f32(db2)[c], 2.0f * f32(db1)[c]) << "dbeta accumulates";
  }
  // dresidual is dy masked by y > 0.
  for (int64_t i = 0; i < dr1.numel(); ++i) EXPECT_EQ(f32(dr1)[i], f32(f.y)[i] > 0.0f ? f32(f.r)[i] : 0.0f) << i;
}

TEST(RefBatchNorm, LayoutsAgree) {
  for (BnFuse fuse : {BnFuse::none, BnFuse::relu, BnFuse::add_relu}) {
    BnFixture a(make_desc({2, 3, 3, 2, fuse, Layout::nchw}), 17);
    BnFixture b(make_desc({2, 3, 3, 2, fuse, Layout::nhwc}), 17);
    b.x = to_layout(a.x, Layout::nhwc), b.residual = to_layout(a.residual, Layout::nhwc);
    b.r = to_layout(a.r, Layout::nhwc);
    b.gamma = copy_tensor(a.gamma), b.beta = copy_tensor(a.beta);
    a.forward();
    b.forward();
    const std::string what(bn_fuse_name(fuse));
    EXPECT_TRUE(all_equal(to_layout(b.y, Layout::nchw), a.y)) << what;
    EXPECT_TRUE(all_equal(b.saved_invstd, a.saved_invstd)) << what;
    EXPECT_TRUE(all_equal(b.running_var, a.running_var)) << what;
    const Shape xs = a.d.x_shape(), cs = {a.d.channels};
    HostTensor dxa = filled_tensor(xs, 0.0f), dra = filled_tensor(xs, 0.0f);
    HostTensor dxb = filled_tensor(xs, 0.0f, Layout::nhwc), drb = filled_tensor(xs, 0.0f, Layout::nhwc);
    HostTensor dga = filled_tensor(cs, 0.0f), dba = filled_tensor(cs, 0.0f);
    HostTensor dgb = filled_tensor(cs, 0.0f), dbb = filled_tensor(cs, 0.0f);
    a.bn->backward(dxa, a.res() ? &dra.view() : nullptr, dga, dba, a.r, a.x, a.y, a.gamma, a.saved_mean,
                   a.saved_invstd);
    b.bn->backward(dxb, b.res() ? &drb.view() : nullptr, dgb, dbb, b.r, b.x, b.y, b.gamma, b.saved_mean,
                   b.saved_invstd);
    EXPECT_TRUE(all_equal(to_layout(dxb, Layout::nchw), dxa)) << what;
    EXPECT_TRUE(all_equal(to_layout(drb, Layout::nchw), dra)) << what;
    EXPECT_TRUE(all_equal(dgb, dga)) << what;
    EXPECT_TRUE(all_equal(dbb, dba)) << what;
  }
}

TEST(RefBatchNorm, RejectsHalfTypes) {
  BatchNormDesc d;
  d.dtype = DType::bf16;
  EXPECT_THROW(make_ref_backend()->make_batch_norm(d), Unsupported);
  d.dtype = DType::f16;
  EXPECT_THROW(make_ref_backend()->make_batch_norm(d), Unsupported);
}

}  // namespace
}  // namespace rn::testing

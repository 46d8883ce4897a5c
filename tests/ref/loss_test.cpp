// Reference softmax cross-entropy: hand values, gradients by finite differences with and
// without label smoothing, grad_scale, and label checking.
#include <gtest/gtest.h>

#include "ref_test_util.h"

namespace rn::testing {
namespace {

struct LossFixture {
  SoftmaxCrossEntropyDesc d;
  std::unique_ptr<SoftmaxCrossEntropyKernel> ce;
  HostTensor loss, probs, logits, labels;

  LossFixture(int64_t n, int64_t k, float smoothing, uint64_t seed) {
    d.batch = n, d.classes = k, d.label_smoothing = smoothing;
    ce = make_ref_backend()->make_softmax_cross_entropy(d);
    Rng rng(seed);
    loss = HostTensor({1}, DType::f32);
    probs = HostTensor({n, k}, DType::f32);
    logits = uniform_tensor({n, k}, rng, -3.0f, 3.0f);
    labels = HostTensor({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i)
      labels.ptr<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(k)));
  }
  double forward() {
    ce->forward(loss, probs, logits, labels);
    return f32(loss)[0];
  }
};

TEST(RefSoftmaxCrossEntropy, HandComputedValues) {
  // Equal logits: p = 1/K and the loss is log K whatever the smoothing.
  for (float eps : {0.0f, 0.1f}) {
    LossFixture f(3, 5, eps, 1);
    std::fill_n(f32(f.logits), 15, 2.5f);
    EXPECT_FLOAT_EQ(static_cast<float>(f.forward()), std::log(5.0f));
    for (int i = 0; i < 15; ++i) EXPECT_FLOAT_EQ(f32(f.probs)[i], 0.2f);
  }
  // Logits (0, log 3): p = (1/4, 3/4); label 1, smoothing 0.1: t = (0.05, 0.95).
  LossFixture f(1, 2, 0.1f, 1);
  f32(f.logits)[0] = 0.0f, f32(f.logits)[1] = std::log(3.0f);
  f.labels.ptr<int32_t>()[0] = 1;
  EXPECT_NEAR(f.forward(), -(0.05 * std::log(0.25) + 0.95 * std::log(0.75)), 1e-6);
  EXPECT_FLOAT_EQ(f32(f.probs)[1], 0.75f);
  HostTensor d({1, 2}, DType::f32);
  f.ce->backward(d, f.probs, f.labels, 1.0f);
  EXPECT_FLOAT_EQ(f32(d)[0], 0.25f - 0.05f);
  EXPECT_FLOAT_EQ(f32(d)[1], 0.75f - 0.95f);
}

TEST(RefSoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  for (float eps : {0.0f, 0.1f}) {
    LossFixture f(4, 7, eps, 3);
    f.forward();
    HostTensor d = filled_tensor({4, 7}, 1e30f);  // overwritten
    f.ce->backward(d, f.probs, f.labels, 1.0f);
    RN_EXPECT_GRAD_OK(check_gradient(
                          f.logits, f32(d), [&] { return f.forward(); }, 1, kStep, 28),
                      "dlogits " + f.d.str());
  }
}

TEST(RefSoftmaxCrossEntropy, GradScaleMultipliesTheGradient) {
  LossFixture f(3, 4, 0.1f, 5);
  f.forward();
  HostTensor d1({3, 4}, DType::f32), d128({3, 4}, DType::f32);
  f.ce->backward(d1, f.probs, f.labels, 1.0f);
  f.ce->backward(d128, f.probs, f.labels, 128.0f);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(f32(d128)[i], 128.0f * f32(d1)[i]) << i;
  // Each row of p - t sums to zero.
  for (int n = 0; n < 3; ++n) {
    double s = 0.0;
    for (int k = 0; k < 4; ++k) s += f32(d1)[n * 4 + k];
    EXPECT_NEAR(s, 0.0, 1e-7);
  }
}

TEST(RefSoftmaxCrossEntropy, BadLabelIsAnError) {
  LossFixture f(3, 5, 0.0f, 7);
  for (int32_t bad : {5, -1, 1000}) {
    f.labels.ptr<int32_t>()[1] = bad;
    try {
      f.forward();
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sample 1"), std::string::npos) << e.what();
    }
    HostTensor d({3, 5}, DType::f32);
    EXPECT_THROW(f.ce->backward(d, f.probs, f.labels, 1.0f), Error);
  }
}

TEST(RefSoftmaxCrossEntropy, StableForLargeLogits) {
  LossFixture f(1, 3, 0.0f, 1);
  f32(f.logits)[0] = 1000.0f, f32(f.logits)[1] = 0.0f, f32(f.logits)[2] = -1000.0f;
  f.labels.ptr<int32_t>()[0] = 1;
  EXPECT_FLOAT_EQ(static_cast<float>(f.forward()), 1000.0f);
  EXPECT_EQ(f32(f.probs)[0], 1.0f);
  EXPECT_EQ(f32(f.probs)[2], 0.0f);
}

}  // namespace
}  // namespace rn::testing

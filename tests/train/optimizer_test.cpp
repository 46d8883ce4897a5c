// The fused optimizer against numbers worked out by hand (derivations in the comments).
// Table: "conv.weight" (decayed, LARS-adapted) at [0, 2) and "bn.bias" (neither) at
// [16, 18); the rest of the 32-element buffer is alignment padding.
#include "train/optimizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/check.h"

namespace rn {
namespace {

ParamTable two_params() {
  ParamTable t;
  ParamView w;
  w.name = "conv.weight";
  w.kind = ParamKind::conv_weight;
  w.shape = Shape{2};
  w.offset = 0;
  w.numel = 2;
  ParamView b;
  b.name = "bn.bias";
  b.kind = ParamKind::bn_beta;
  b.shape = Shape{2};
  b.offset = 16;
  b.numel = 2;
  b.weight_decay = false;
  b.lars_adapt = false;
  t.params = {w, b};
  t.total = 32;
  return t;
}

struct Buffers {
  std::vector<float> w = std::vector<float>(32, 7.0f);  // padding holds 7
  std::vector<float> g = std::vector<float>(32, std::numeric_limits<float>::quiet_NaN());
};

constexpr float kTol = 1e-6f;

OptimizerConfig sgd_config(bool nesterov) {
  OptimizerConfig c;
  c.name = OptimizerKind::sgd;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  c.nesterov = nesterov;
  return c;
}

// w = [1, -2], g = [0.5, 0.25] (decayed); w = [0.5, 0.5], g = [1, -1] (not decayed).
Buffers sgd_buffers() {
  Buffers b;
  b.w[0] = 1.0f, b.w[1] = -2.0f, b.g[0] = 0.5f, b.g[1] = 0.25f;
  b.w[16] = 0.5f, b.w[17] = 0.5f, b.g[16] = 1.0f, b.g[17] = -1.0f;
  return b;
}

TEST(Optimizer, SgdMomentumTwoSteps) {
  ParamTable t = two_params();
  Optimizer opt(sgd_config(false), t);
  Buffers b = sgd_buffers();
  // Step 1, lr 0.1: d = g + 0.01 w = [0.51, 0.23]; buf = d; w -= 0.1 buf -> [0.949, -2.023].
  // No decay on bn.bias: buf = [1, -1]; w = [0.4, 0.6].
  opt.step(b.w.data(), b.g.data(), 0.1);
  EXPECT_NEAR(b.w[0], 0.949f, kTol);
  EXPECT_NEAR(b.w[1], -2.023f, kTol);
  EXPECT_NEAR(b.w[16], 0.4f, kTol);
  EXPECT_NEAR(b.w[17], 0.6f, kTol);
  // Step 2: d = [0.5 + 0.00949, 0.25 - 0.02023] = [0.50949, 0.22977];
  // buf = 0.9 [0.51, 0.23] + d = [0.96849, 0.43677]; w = [0.949 - 0.096849, -2.023 - 0.043677].
  // bn.bias: buf = 0.9 [1, -1] + [1, -1] = [1.9, -1.9]; w = [0.4 - 0.19, 0.6 + 0.19].
  opt.step(b.w.data(), b.g.data(), 0.1);
  EXPECT_NEAR(b.w[0], 0.852151f, kTol);
  EXPECT_NEAR(b.w[1], -2.066677f, kTol);
  EXPECT_NEAR(b.w[16], 0.21f, kTol);
  EXPECT_NEAR(b.w[17], 0.79f, kTol);
  EXPECT_NEAR(opt.state()[0], 0.96849f, kTol);
  EXPECT_NEAR(opt.state()[17], -1.9f, kTol);
  // The padding is never read or written (its gradients are NaN here).
  EXPECT_EQ(b.w[5], 7.0f);
  EXPECT_EQ(opt.state()[5], 0.0f);
}

TEST(Optimizer, SgdNesterovTwoSteps) {
  ParamTable t = two_params();
  Optimizer opt(sgd_config(true), t);
  Buffers b = sgd_buffers();
  // Step 1: d = [0.51, 0.23]; buf = d; update = d + 0.9 buf = 1.9 d = [0.969, 0.437];
  // w = [1 - 0.0969, -2 - 0.0437].
  opt.step(b.w.data(), b.g.data(), 0.1);
  EXPECT_NEAR(b.w[0], 0.9031f, kTol);
  EXPECT_NEAR(b.w[1], -2.0437f, kTol);
  // Step 2: d = [0.5 + 0.009031, 0.25 - 0.020437] = [0.509031, 0.229563];
  // buf = [0.459 + 0.509031, 0.207 + 0.229563] = [0.968031, 0.436563];
  // update = d + 0.9 buf = [1.3802589, 0.6224697]; w = [0.9031 - 0.13802589, -2.0437 - 0.06224697].
  opt.step(b.w.data(), b.g.data(), 0.1);
  EXPECT_NEAR(b.w[0], 0.76507411f, kTol);
  EXPECT_NEAR(b.w[1], -2.10594697f, kTol);
  // bn.bias, no decay: step 1 update = 1.9 [1, -1] -> w = [0.31, 0.69];
  // step 2: buf = [1.9, -1.9], update = [1 + 1.71, -1 - 1.71] -> w = [0.31 - 0.271, 0.69 + 0.271].
  EXPECT_NEAR(b.w[16], 0.039f, kTol);
  EXPECT_NEAR(b.w[17], 0.961f, kTol);
}

TEST(Optimizer, GradMultiplierUnscales) {
  ParamTable t = two_params();
  Optimizer opt(sgd_config(false), t);
  Buffers b = sgd_buffers();
  for (int i : {0, 1, 16, 17}) b.g[i] *= 128.0f;  // gradients of a loss scaled by 128
  opt.step(b.w.data(), b.g.data(), 0.1, 1.0f / 128.0f);
  EXPECT_NEAR(b.w[0], 0.949f, kTol);  // as in SgdMomentumTwoSteps, step 1
  EXPECT_NEAR(b.w[1], -2.023f, kTol);
  EXPECT_NEAR(b.w[16], 0.4f, kTol);
}

TEST(Optimizer, ParamPolicyMasksBnAndBias) {
  ParamTable t = two_params();
  t.params[1].weight_decay = true;
  t.params[1].lars_adapt = true;
  OptimizerConfig c = sgd_config(false);
  apply_optimizer_param_policy(t, c);
  EXPECT_TRUE(t.params[0].weight_decay);
  EXPECT_TRUE(t.params[0].lars_adapt);
  EXPECT_FALSE(t.params[1].weight_decay);
  EXPECT_FALSE(t.params[1].lars_adapt);
  c.decay_bn_and_bias = true;
  apply_optimizer_param_policy(t, c);
  EXPECT_TRUE(t.params[1].weight_decay);
  EXPECT_FALSE(t.params[1].lars_adapt);

  // Now decayed: bn.bias step 1, d = g + 0.01 w = [1.005, -0.995]; w = [0.5 - 0.1005, 0.5 + 0.0995].
  Optimizer opt(c, t);
  Buffers b = sgd_buffers();
  opt.step(b.w.data(), b.g.data(), 0.1);
  EXPECT_NEAR(b.w[16], 0.3995f, kTol);
  EXPECT_NEAR(b.w[17], 0.5995f, kTol);
}

OptimizerConfig lars_config(bool nesterov) {
  OptimizerConfig c;
  c.name = OptimizerKind::lars;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  c.lars_eta = 0.1;
  c.lars_eps = 0;
  c.nesterov = nesterov;
  return c;
}

// w = [3, 4] (|w| = 5), g = [0.6, 0.8] (|g| = 1); bn.bias as before.
Buffers lars_buffers() {
  Buffers b;
  b.w[0] = 3.0f, b.w[1] = 4.0f, b.g[0] = 0.6f, b.g[1] = 0.8f;
  b.w[16] = 0.5f, b.w[17] = 0.5f, b.g[16] = 1.0f, b.g[17] = -1.0f;
  return b;
}

TEST(Optimizer, LarsTwoSteps) {
  ParamTable t = two_params();
  Optimizer opt(lars_config(false), t);
  Buffers b = lars_buffers();
  // Step 1, lr 1: ratio = 0.1 * 5 / (1 + 0.01 * 5) = 0.5 / 1.05; d = g + 0.01 w = [0.63, 0.84] = 1.05 [0.6, 0.8];
  // v = ratio d = 0.5 [0.6, 0.8] = [0.3, 0.4]; w = [2.7, 3.6].
  // bn.bias (not adapted, not decayed): v = lr g = [1, -1]; w = [-0.5, 1.5].
  // (The ratio is computed in double from float inputs: 0.6f and 0.8f are off by ~1e-8.)
  opt.step(b.w.data(), b.g.data(), 1.0);
  EXPECT_NEAR(opt.last_trust_ratios()[0], 0.5 / 1.05, 1e-7);
  EXPECT_EQ(opt.last_trust_ratios()[1], 1.0);
  EXPECT_NEAR(b.w[0], 2.7f, kTol);
  EXPECT_NEAR(b.w[1], 3.6f, kTol);
  EXPECT_NEAR(b.w[16], -0.5f, kTol);
  EXPECT_NEAR(b.w[17], 1.5f, kTol);
  // Step 2: |w| = 4.5; ratio = 0.45 / 1.045; d = [0.627, 0.836] = 1.045 [0.6, 0.8];
  // ratio d = 0.45 [0.6, 0.8] = [0.27, 0.36]; v = 0.9 [0.3, 0.4] + [0.27, 0.36] = [0.54, 0.72];
  // w = [2.7 - 0.54, 3.6 - 0.72] = [2.16, 2.88].
  // bn.bias: v = 0.9 [1, -1] + [1, -1] = [1.9, -1.9]; w = [-2.4, 3.4].
  opt.step(b.w.data(), b.g.data(), 1.0);
  EXPECT_NEAR(opt.last_trust_ratios()[0], 0.45 / 1.045, 1e-7);
  EXPECT_NEAR(b.w[0], 2.16f, kTol);
  EXPECT_NEAR(b.w[1], 2.88f, kTol);
  EXPECT_NEAR(b.w[16], -2.4f, kTol);
  EXPECT_NEAR(b.w[17], 3.4f, kTol);
}

TEST(Optimizer, LarsNesterovAndLrScale) {
  ParamTable t = two_params();
  Optimizer opt(lars_config(true), t);
  Buffers b = lars_buffers();
  // lr 0.5: ratio d = [0.3, 0.4] as above, times 0.5 = [0.15, 0.2] = v;
  // update = 0.9 v + [0.15, 0.2] = 1.9 [0.15, 0.2] = [0.285, 0.38]; w = [2.715, 3.62].
  opt.step(b.w.data(), b.g.data(), 0.5);
  EXPECT_NEAR(b.w[0], 2.715f, kTol);
  EXPECT_NEAR(b.w[1], 3.62f, kTol);
}

TEST(Optimizer, LarsZeroNormMeansRatioOne) {
  ParamTable t = two_params();
  Optimizer opt(lars_config(false), t);
  Buffers b = lars_buffers();
  b.w[0] = 0.0f, b.w[1] = 0.0f;  // |w| = 0: ratio 1, d = g, w = -lr g
  opt.step(b.w.data(), b.g.data(), 1.0);
  EXPECT_EQ(opt.last_trust_ratios()[0], 1.0);
  EXPECT_NEAR(b.w[0], -0.6f, kTol);
  EXPECT_NEAR(b.w[1], -0.8f, kTol);
}

TEST(Optimizer, LarsNormsOverManySegments) {
  // One tensor spanning several segments: the trust ratio must use the whole tensor.
  const int64_t n = 3 * Optimizer::kSegment + 123;
  ParamTable t;
  ParamView v;
  v.name = "fc.weight";
  v.kind = ParamKind::linear_weight;
  v.shape = Shape{n};
  v.numel = n;
  t.params = {v};
  t.total = n;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> w(n), g(n);
  double w2 = 0, g2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    w[i] = normal(rng), g[i] = 0.01f * normal(rng);
    w2 += double(w[i]) * w[i], g2 += double(g[i]) * g[i];
  }
  OptimizerConfig c = lars_config(false);
  c.lars_eta = 0.001;
  Optimizer opt(c, t);
  std::vector<float> w0 = w;
  opt.step(w.data(), g.data(), 2.0);
  const double ratio = 0.001 * std::sqrt(w2) / (std::sqrt(g2) + 0.01 * std::sqrt(w2));
  EXPECT_NEAR(opt.last_trust_ratios()[0], ratio, 1e-12 * ratio);  // only the summation order differs
  for (int64_t i : {int64_t{0}, Optimizer::kSegment, n - 1}) {
    const float expected = w0[i] - static_cast<float>(2.0 * ratio) * (g[i] + 0.01f * w0[i]);
    EXPECT_NEAR(w[i], expected, 1e-6f);
  }
}

TEST(Optimizer, BitwiseSameForAnyThreadCount) {
  // Several tensors of several segments each, LARS with Nesterov: every thread count must
  // give the same bits.
  ParamTable t;
  int64_t offset = 0;
  for (int64_t numel : {Optimizer::kSegment * 2 + 5, int64_t{17}, Optimizer::kSegment * 3, int64_t{64}}) {
    ParamView v;
    v.name = fmt::format("p{}", t.params.size());
    v.kind = numel == 17 ? ParamKind::bn_gamma : ParamKind::conv_weight;
    v.shape = Shape{numel};
    v.offset = offset;
    v.numel = numel;
    v.weight_decay = v.lars_adapt = numel != 17;
    t.params.push_back(v);
    offset += (numel + 15) / 16 * 16;
  }
  t.total = offset;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> w0(t.total), g(t.total);
  for (int64_t i = 0; i < t.total; ++i) w0[i] = normal(rng), g[i] = 0.1f * normal(rng);

  OptimizerConfig c = lars_config(true);
  std::vector<float> reference;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    Optimizer opt(c, t, &pool);
    std::vector<float> w = w0;
    for (int step = 0; step < 3; ++step) opt.step(w.data(), g.data(), 0.5, 0.25f);
    if (reference.empty()) reference = w;
    EXPECT_EQ(std::memcmp(w.data(), reference.data(), w.size() * sizeof(float)), 0) << threads << " threads";
  }
}

TEST(Optimizer, StateRestoreContinuesExactly) {
  ParamTable t = two_params();
  Buffers a = sgd_buffers();
  Optimizer one(sgd_config(false), t);
  one.step(a.w.data(), a.g.data(), 0.1);
  std::vector<float> saved_state = one.state();
  Buffers b = a;  // weights after step 1
  one.step(a.w.data(), a.g.data(), 0.1);

  Optimizer two(sgd_config(false), t);
  two.set_state(saved_state);
  two.step(b.w.data(), b.g.data(), 0.1);
  for (int i : {0, 1, 16, 17}) EXPECT_EQ(a.w[i], b.w[i]) << i;
  EXPECT_THROW(two.set_state(std::vector<float>(5)), Error);
}

TEST(Optimizer, RejectsViewOutsideBuffer) {
  ParamTable t = two_params();
  t.total = 17;
  EXPECT_THROW(Optimizer(sgd_config(false), t), Error);
}

}  // namespace
}  // namespace rn

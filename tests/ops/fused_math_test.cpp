// The arithmetic of the CUDA backend's custom kernels (ops/fused_math.h), checked on the
// CPU: against the host optimizer, loss scaler and normaliser, which call the same
// functions, and against independent derivations (finite differences, sums).
#include "ops/fused_math.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "data/normalize.h"
#include "ops/fused_step.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#ifdef RN_HAVE_CUDA
#include "backends/cuda/cudnn_algo_cache.h"
#endif

namespace rn {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(FusedMath, InfOrNanBits) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1.0f, -3.0e38f, 1e-45f, std::numeric_limits<float>::max()})
    EXPECT_FALSE(fused::is_inf_or_nan_bits(bits_of(v))) << v;
  for (float v : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()})
    EXPECT_TRUE(fused::is_inf_or_nan_bits(bits_of(v))) << v;
}

// The device loss-scale rule and the host LossScaler agree step by step over a history
// with overflows, growth and the bounds.
TEST(FusedMath, LossScaleRuleMatchesLossScaler) {
  LossScaleConfig cfg;
  cfg.policy = LossScalePolicy::dynamic;
  cfg.initial = 4;
  cfg.growth_interval = 3;
  cfg.growth_factor = 2;
  cfg.backoff_factor = 0.5;
  LossScaler host(cfg);
  fused::LossScaleCounters dev{host.state().scale, 0, 0, 0, 0};
  const fused::LossScaleRule rule = host.rule();
  Rng rng(3);
  for (int i = 0; i < 200; ++i) {
    const bool overflow = i < 6 || rng.below(5) == 0;  // first a run of overflows down to the floor
    const bool host_applied = host.update(overflow);
    const bool dev_applied = fused::loss_scale_update(dev, rule, overflow);
    ASSERT_EQ(host_applied, dev_applied) << "step " << i;
    const LossScaler::State& s = host.state();
    ASSERT_EQ(s.scale, dev.scale) << "step " << i;
    ASSERT_EQ(s.step, dev.step);
    ASSERT_EQ(s.clean_steps, dev.clean_steps);
    ASSERT_EQ(s.skipped_steps, dev.skipped_steps);
    ASSERT_EQ(s.consecutive_skips, dev.consecutive_skips);
  }
  EXPECT_GE(dev.scale, 1.0);
}

// The device's record of scale changes: one entry per change, with its step, its from/to and
// why; a ring that keeps the last kScaleChangeLog while counting all.
TEST(FusedMath, ScaleChangesAreRecordedWithTheirSteps) {
  fused::LossScaleRule rule;
  rule.growth_interval = 2;
  fused::LossScaleCounters c{128, 0, 0, 0, 0};
  fused::LossScaleChangeLog log;
  auto step = [&](bool overflow) {
    const fused::LossScaleCounters before = c;
    fused::loss_scale_update(c, rule, overflow);
    fused::record_scale_change(log, before, c, overflow);
  };
  step(false);  // step 1: no change
  EXPECT_EQ(log.count, 0);
  step(false);  // step 2: 128 -> 256 after 2 clean steps
  step(true);   // step 3: 256 -> 128, 1 skipped in a row
  step(true);   // step 4: 128 -> 64, 2 in a row
  ASSERT_EQ(log.count, 3);
  EXPECT_EQ(LossScaler::change_text(log.entries[0]), "loss scale 128 -> 256 at step 2 (2 steps without overflow)");
  EXPECT_EQ(LossScaler::change_text(log.entries[1]), "loss scale 256 -> 128 at step 3 (overflow, 1 skipped in a row)");
  EXPECT_EQ(LossScaler::change_text(log.entries[2]), "loss scale 128 -> 64 at step 4 (overflow, 2 skipped in a row)");
  // Past the ring's size the oldest entries are overwritten; the count goes on.
  rule.growth_interval = 1;
  rule.max_scale = 1e300;
  for (int i = 0; i < fused::kScaleChangeLog; ++i) step(false);
  EXPECT_EQ(log.count, 3 + fused::kScaleChangeLog);
  const fused::LossScaleChange& last = log.entries[(log.count - 1) % fused::kScaleChangeLog];
  EXPECT_EQ(last.step, 4 + fused::kScaleChangeLog);
  EXPECT_EQ(last.to, c.scale);
  EXPECT_EQ(last.run, 1);
}

TEST(FusedMath, StaticRuleNeverChangesTheScale) {
  fused::LossScaleRule r;
  r.dynamic = false;
  fused::LossScaleCounters c{128, 0, 0, 0, 0};
  EXPECT_FALSE(fused::loss_scale_update(c, r, true));
  for (int i = 0; i < 5000; ++i) fused::loss_scale_update(c, r, false);
  EXPECT_EQ(c.scale, 128);
  EXPECT_EQ(c.skipped_steps, 1);
}

// One element of SGD by hand (PyTorch's formula) against the shared function, and the host
// Optimizer (which uses it) against a loop over the shared functions.
TEST(FusedMath, SgdElementAndOptimizerAgree) {
  float w = 0.5f, buf = 0.25f;
  fused::sgd_update_element(w, buf, 0.1f, 0.01f, 0.2f, 0.9f, true);
  const float d = 0.1f + 0.01f * 0.5f, b = 0.9f * 0.25f + d;
  EXPECT_FLOAT_EQ(buf, b);
  EXPECT_FLOAT_EQ(w, 0.5f - 0.2f * (d + 0.9f * b));

  ParamTable table;
  table.params.push_back({"a", ParamKind::conv_weight, {40}, 0, 40, true, true});
  table.params.push_back({"b", ParamKind::bn_beta, {8}, 48, 8, false, false});
  table.total = 64;
  OptimizerConfig cfg;
  cfg.momentum = 0.9;
  cfg.weight_decay = 1e-2;
  cfg.nesterov = false;
  Optimizer opt(cfg, table);
  Rng rng(1);
  std::vector<float> w1(64), g(64), w2, m2(64, 0.0f);
  for (auto& v : w1) v = rng.uniform(-1, 1);
  for (auto& v : g) v = rng.uniform(-100, 100);
  w2 = w1;
  const float inv_scale = 1.0f / 128.0f;
  opt.step(w1.data(), g.data(), 0.1, inv_scale);
  for (const auto& p : table.params)
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      fused::sgd_update_element(w2[i], m2[i], g[i] * inv_scale, p.weight_decay ? 1e-2f : 0.0f, 0.1f, 0.9f, false);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(bits_of(w1[i]), bits_of(w2[i])) << i;
}

TEST(FusedMath, LarsTrustRatio) {
  EXPECT_DOUBLE_EQ(fused::lars_trust_ratio(0.0, 1.0, 0.1, 0.001, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(fused::lars_trust_ratio(1.0, 0.0, 0.1, 0.001, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(fused::lars_trust_ratio(2.0, 3.0, 0.5, 0.001, 0.0), 0.001 * 2.0 / (3.0 + 1.0));
}

// Batch norm's backward formula against central finite differences of the training-mode
// forward (loss = sum(dy * y)), in double for a clean comparison.
TEST(FusedMath, BatchNormBackwardMatchesFiniteDifferences) {
  const int n = 12;
  Rng rng(5);
  std::vector<double> x(n), dy(n);
  for (auto& v : x) v = rng.uniform(-2, 3);
  for (auto& v : dy) v = rng.uniform(-1, 1);
  const double gamma = 1.3, beta = 0.2, eps = 1e-5;
  auto loss = [&](const std::vector<double>& xs) {
    double mean = 0, var = 0;
    for (double v : xs) mean += v;
    mean /= n;
    for (double v : xs) var += (v - mean) * (v - mean);
    var /= n;
    const double invstd = 1 / std::sqrt(var + eps);
    double l = 0;
    for (int i = 0; i < n; ++i)
      l += dy[i] * fused::bn_apply(static_cast<float>(xs[i]), static_cast<float>(mean), static_cast<float>(invstd),
                                   gamma, beta);
    return l;
  };
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  const double invstd = 1 / std::sqrt(var + eps);
  double sum_dy = 0, sum_dy_xhat = 0;
  for (int i = 0; i < n; ++i) sum_dy += dy[i], sum_dy_xhat += dy[i] * (x[i] - mean) * invstd;
  for (int i = 0; i < n; ++i) {
    const float dx = fused::bn_backward_dx(
        static_cast<float>(dy[i]), static_cast<float>(x[i]), static_cast<float>(mean), static_cast<float>(invstd),
        static_cast<float>(gamma), static_cast<float>(sum_dy), static_cast<float>(sum_dy_xhat), 1.0f / n);
    auto xp = x, xm = x;
    const double h = 1e-3;
    xp[i] += h, xm[i] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    EXPECT_NEAR(dx, fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "element " << i;
  }
}

// The batch statistics as the CUDA kernel combines them (backends/cuda/kernels.cu): fp32
// Welford runs of `per_thread` rows, merged pairwise in fp32 by a tree of `threads` runs,
// then the splits merged in double. Returns {mean, biased var}.
std::pair<double, double> tiled_welford(const std::vector<float>& x, int per_thread, int threads) {
  double n = 0, mean = 0, m2 = 0;
  const size_t split_rows = static_cast<size_t>(per_thread) * static_cast<size_t>(threads);
  for (size_t s0 = 0; s0 < x.size(); s0 += split_rows) {
    std::vector<float> tn(threads, 0.0f), tm(threads, 0.0f), tq(threads, 0.0f);
    for (int t = 0; t < threads; ++t)
      for (size_t i = s0 + static_cast<size_t>(t); i < std::min(x.size(), s0 + split_rows); i += threads) {
        tn[t] += 1.0f;
        fused::welford_add(tm[t], tq[t], x[i], 1.0f / tn[t]);
      }
    for (int half = threads / 2; half > 0; half /= 2)
      for (int t = 0; t < half; ++t) fused::chan_combine(tn[t], tm[t], tq[t], tn[t + half], tm[t + half], tq[t + half]);
    fused::chan_combine(n, mean, m2, static_cast<double>(tn[0]), static_cast<double>(tm[0]),
                        static_cast<double>(tq[0]));
  }
  return {mean, m2 / n};
}

std::pair<double, double> two_pass(const std::vector<float>& x) {
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (float v : x) var += (v - mean) * (v - mean);
  return {mean, var / static_cast<double>(x.size())};
}

TEST(FusedMath, OnePassBatchStatisticsMatchTwoPassInDouble) {
  Rng rng(17);
  // Typical activations, and a channel whose mean is a thousand times its spread, where the
  // sum of squares minus the squared sum in fp32 loses every digit.
  for (const float offset : {0.5f, 1000.0f}) {
    std::vector<float> x(5001);
    for (float& v : x) v = offset + rng.normal();
    const auto [mean, var] = tiled_welford(x, 40, 32);
    const auto [want_mean, want_var] = two_pass(x);
    EXPECT_NEAR(mean, want_mean, 1e-6 * std::fabs(want_mean)) << "offset " << offset;
    EXPECT_NEAR(var, want_var, 1e-4 * want_var) << "offset " << offset;
    float s1 = 0, s2 = 0;
    for (float v : x) s1 += v, s2 += v * v;
    const double naive = s2 / x.size() - (s1 / x.size()) * (s1 / x.size());
    if (offset > 100) {
      EXPECT_GT(std::fabs(naive - want_var), 0.01 * want_var) << "the data should defeat the naive formula";
    }
  }
  // Runs of one and of no value merge as they should.
  float n = 0, m = 0, q = 0;
  fused::chan_combine(n, m, q, 0.0f, 5.0f, 1.0f);
  EXPECT_EQ(n, 0.0f);
  fused::chan_combine(n, m, q, 1.0f, 3.0f, 0.0f);
  fused::chan_combine(n, m, q, 1.0f, 5.0f, 0.0f);
  EXPECT_EQ(n, 2.0f);
  EXPECT_FLOAT_EQ(m, 4.0f);
  EXPECT_FLOAT_EQ(q, 2.0f);  // (3-4)^2 + (5-4)^2
}

TEST(FusedMath, BatchNormRunningUpdateIsPyTorchs) {
  float rm = 1.0f, rv = 2.0f;
  fused::bn_running_update(rm, rv, 3.0f, 4.0f, 0.1f, 5);
  EXPECT_FLOAT_EQ(rm, 0.9f * 1.0f + 0.1f * 3.0f);
  EXPECT_FLOAT_EQ(rv, 0.9f * 2.0f + 0.1f * 4.0f * 5.0f / 4.0f);
}

// The gradient of the mean smoothed cross-entropy sums to zero over the classes of a sample
// and is grad_scale * (p - t) / N.
TEST(FusedMath, SoftmaxCrossEntropyGradient) {
  const int K = 7, N = 3;
  const float smoothing = 0.1f, scale = 64.0f;
  std::vector<float> p = {0.1f, 0.2f, 0.05f, 0.3f, 0.15f, 0.1f, 0.1f};
  double sum = 0;
  for (int k = 0; k < K; ++k) sum += fused::softmax_ce_grad(p[k], k == 3, smoothing, K, scale, N);
  EXPECT_NEAR(sum, 0.0, 1e-5);
  EXPECT_FLOAT_EQ(fused::softmax_ce_grad(0.3f, true, smoothing, K, scale, N),
                  scale * (0.3f - (0.9f + 0.1f / 7.0f)) / 3.0f);
}

// The device normalisation equals the loader's Normalizer bit for bit.
TEST(FusedMath, NormalizeMatchesNormalizer) {
  const std::vector<float> mean = {0.485f, 0.456f, 0.406f}, stdv = {0.229f, 0.224f, 0.225f};
  Normalizer norm(3, mean, stdv);
  std::vector<uint8_t> src(256 * 3);
  for (int v = 0; v < 256; ++v)
    for (int c = 0; c < 3; ++c) src[static_cast<size_t>(v * 3 + c)] = static_cast<uint8_t>(v);
  HostTensor out({1, 3, 16, 16}, DType::f32, Layout::nhwc);
  norm.apply(src.data(), 1, out);
  for (int v = 0; v < 256; ++v)
    for (int c = 0; c < 3; ++c)
      ASSERT_EQ(bits_of(out.ptr<float>()[v * 3 + c]),
                bits_of(fused::normalize_u8(static_cast<uint8_t>(v), mean[static_cast<size_t>(c)],
                                            stdv[static_cast<size_t>(c)])))
          << "value " << v << " channel " << c;
}

TEST(FusedMath, CropFlipSource) {
  EXPECT_EQ(fused::crop_flip_source_x(0, 5, 10, false), 5);
  EXPECT_EQ(fused::crop_flip_source_x(0, 5, 10, true), 14);
  EXPECT_EQ(fused::crop_flip_source_x(9, 5, 10, true), 5);
}

TEST(FusedStepDesc, RejectsBadInput) {
  FusedStepDesc d;
  d.total = 16;
  d.params.push_back({8, 16, 0.0f, false});
  EXPECT_THROW(d.validate(), Error);
  d.params[0].numel = 8;
  EXPECT_NO_THROW(d.validate());
  d.half = DType::i32;
  EXPECT_THROW(d.validate(), Error);
}

#ifdef RN_HAVE_CUDA
TEST(CudnnAlgoCache, LinesRoundTripAndBadLinesAreRejected) {
  using cuda::CudnnAlgoCache;
  using cuda::CudnnAlgoChoice;
  std::string key;
  CudnnAlgoChoice c;
  const std::string line = CudnnAlgoCache::format_line("fwd|f16|nhwc|n2", {6, 1 << 20, 1});
  ASSERT_TRUE(CudnnAlgoCache::parse_line(line, &key, &c));
  EXPECT_EQ(key, "fwd|f16|nhwc|n2");
  EXPECT_EQ(c.algo, 6);
  EXPECT_EQ(c.workspace, size_t{1} << 20);
  EXPECT_EQ(c.math_type, 1);
  for (const char* bad : {"", "key", "key\t1\t2", "key\tx\t2\t1", "key\t-1\t2\t1", "\t1\t2\t1", "key\t1\t2\t1x"})
    EXPECT_FALSE(CudnnAlgoCache::parse_line(bad, &key, &c)) << "'" << bad << "'";
}

TEST(CudnnAlgoCache, PersistsAcrossInstances) {
  // A temporary folder: a build carried to a GPU machine may not have its build tree there.
  const std::string path =
      (std::filesystem::temp_directory_path() / ("rn_algo_cache_test_" + std::to_string(::getpid()) + ".tsv")).string();
  std::remove(path.c_str());
  {
    cuda::CudnnAlgoCache cache(path);
    EXPECT_EQ(cache.size(), 0u);
    cache.put("a", {1, 10, 0});
    cache.put("b", {2, 20, 1});
  }
  cuda::CudnnAlgoCache again(path);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again.find("b")->workspace, 20u);
  EXPECT_FALSE(again.find("c").has_value());
  std::remove(path.c_str());
}
#endif

}  // namespace
}  // namespace rn

// The arithmetic of the fused device kernels, as small inline functions that compile for
// the host and, under nvcc, for the device (RN_HD). The CUDA kernels call them per element;
// the CPU optimizer, loss scaler, normaliser and the tests call the same functions, so the
// GPU's arithmetic is checked on machines without a GPU (tests/ops/fused_math_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RN_HD __host__ __device__
#else
#define RN_HD
#endif

namespace rn::fused {

// ---- optimizer (see train/optimizer.h for the formulas' provenance) --------------------
// SGD, PyTorch semantics with dampening 0; g is the unscaled gradient, wd 0 where the
// parameter is not decayed.
RN_HD inline void sgd_update_element(float& w, float& buf, float g, float wd, float lr, float momentum, bool nesterov) {
  const float d = g + wd * w;
  buf = momentum * buf + d;
  w -= lr * (nesterov ? d + momentum * buf : buf);
}

// LARS, the MLPerf reference form (the lr lives inside the momentum buffer).
RN_HD inline void lars_update_element(float& w, float& v, float g, float wd, float scaled_lr, float momentum,
                                      bool nesterov) {
  const float d = g + wd * w;
  v = momentum * v + scaled_lr * d;
  w -= nesterov ? momentum * v + scaled_lr * d : v;
}

RN_HD inline double lars_trust_ratio(double w_norm, double g_norm, double wd, double eta, double eps) {
  if (!(w_norm > 0) || !(g_norm > 0)) return 1.0;
  return eta * w_norm / (g_norm + wd * w_norm + eps);
}

// ---- loss scaling -----------------------------------------------------------------------
// An all-ones exponent: inf or NaN.
RN_HD inline bool is_inf_or_nan_bits(uint32_t bits) { return (bits & 0x7f800000u) == 0x7f800000u; }

// The dynamic loss-scale rule, on the state the device keeps. Returns whether the step is
// applied (no overflow). min_scale/max_scale already account for an initial value outside
// [1, 2^24] (LossScaler passes min(1, initial) and max(2^24, initial)).
struct LossScaleRule {
  bool dynamic = true;
  double backoff = 0.5, growth = 2.0;
  int64_t growth_interval = 2000;
  double min_scale = 1.0, max_scale = 16777216.0;
};
struct LossScaleCounters {
  double scale = 1.0;
  int64_t step = 0, clean_steps = 0, skipped_steps = 0, consecutive_skips = 0;
};
RN_HD inline bool loss_scale_update(LossScaleCounters& s, const LossScaleRule& r, bool overflow) {
  if (overflow) {
    ++s.skipped_steps;
    ++s.consecutive_skips;
    s.clean_steps = 0;
    if (r.dynamic) {
      const double next = s.scale * r.backoff;
      s.scale = next > r.min_scale ? next : r.min_scale;
    }
  } else {
    s.consecutive_skips = 0;
    ++s.clean_steps;
    if (r.dynamic && s.clean_steps >= r.growth_interval) {
      const double next = s.scale * r.growth;
      s.scale = next < r.max_scale ? next : r.max_scale;
      s.clean_steps = 0;
    }
  }
  ++s.step;
  return !overflow;
}

// The device's record of its loss-scale changes. The host reads the device's counters only at
// its synchronisations (log lines, sink windows), so it would see several changes as one; the
// step that changes the scale records the change here, and the host logs each one, with its
// step, when it next reads the record. A ring: `count` changes so far, the last
// kScaleChangeLog of them kept.
struct LossScaleChange {
  int64_t step = 0;  // the step (counted from 1) whose update changed the scale
  double from = 0, to = 0;
  int64_t run = 0;  // overflow: steps skipped in a row; growth: steps without overflow
  int32_t overflow = 0;
};
inline constexpr int kScaleChangeLog = 64;
struct LossScaleChangeLog {
  int64_t count = 0;
  LossScaleChange entries[kScaleChangeLog];
};
// The change loss_scale_update made in taking `before` to `after` (meaningful when the scale
// changed).
RN_HD inline LossScaleChange scale_change(const LossScaleCounters& before, const LossScaleCounters& after,
                                          bool overflow) {
  LossScaleChange c;
  c.step = after.step;
  c.from = before.scale;
  c.to = after.scale;
  c.run = overflow ? after.consecutive_skips : before.clean_steps + 1;
  c.overflow = overflow ? 1 : 0;
  return c;
}
// Records that change in the ring, if the scale changed.
RN_HD inline void record_scale_change(LossScaleChangeLog& log, const LossScaleCounters& before,
                                      const LossScaleCounters& after, bool overflow) {
  if (after.scale == before.scale) return;
  log.entries[log.count % kScaleChangeLog] = scale_change(before, after, overflow);
  ++log.count;
}

// ---- batch norm ---------------------------------------------------------------------------
// Batch statistics in one pass (Welford): a run of values kept as (count, mean, m2) with
// m2 the sum of squared deviations from the mean. welford_add takes the next value with
// inv_n = 1 / the new count (one division serves the channels of a vector); chan_combine
// merges two runs (Chan et al.). Neither subtracts large sums, so |mean| >> std loses nothing.
template <typename F>
RN_HD inline void welford_add(F& mean, F& m2, F x, F inv_n) {
  const F d = x - mean;
  mean += d * inv_n;
  m2 += d * (x - mean);
}
template <typename F>
RN_HD inline void chan_combine(F& n, F& mean, F& m2, F nb, F mean_b, F m2_b) {
  if (nb == F(0)) return;
  const F nt = n + nb, d = mean_b - mean, wb = nb / nt;
  mean += d * wb;
  m2 += m2_b + d * d * (n * wb);
  n = nt;
}

// y = gamma * (x - mean) * invstd + beta, then the fused ReLU / add+ReLU. The multiply-adds
// of these two are explicit fmaf (one rounding, on the host too), so that no compiler's choice
// to contract or not changes a bit: a kernel's results do not depend on which of its
// instantiations ran (vector width), and the host computes exactly what the device does.
RN_HD inline float bn_apply(float x, float mean, float invstd, float gamma, float beta) {
  return fmaf(gamma, (x - mean) * invstd, beta);
}
// A NaN stays NaN (as PyTorch's and oneDNN's ReLU keep it): mapped to 0, a model gone NaN
// looked healthy on the GPU, with finite losses.
RN_HD inline float relu(float v) { return v > 0.0f || v != v ? v : 0.0f; }

// Backward of batch norm in training mode per element, given the per-channel sums
// sum_dy = sum(dy) and sum_dy_xhat = sum(dy * xhat) over the n = N*H*W values:
//   dx = gamma * invstd * (dy - sum_dy / n - xhat * sum_dy_xhat / n)
RN_HD inline float bn_backward_dx(float dy, float x, float mean, float invstd, float gamma, float sum_dy,
                                  float sum_dy_xhat, float inv_n) {
  const float xhat = (x - mean) * invstd;
  const float centred = fmaf(-sum_dy, inv_n, dy);                   // dy - sum_dy / n
  return (gamma * invstd) * fmaf(-xhat, sum_dy_xhat * inv_n, centred);  // ... - xhat * sum_dy_xhat / n
}

// Running statistics, PyTorch's rule: var is the biased batch variance over n values.
RN_HD inline void bn_running_update(float& running_mean, float& running_var, float mean, float var, float momentum,
                                    int64_t n) {
  const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
  running_mean = (1.0f - momentum) * running_mean + momentum * mean;
  running_var = (1.0f - momentum) * running_var + momentum * static_cast<float>(var * unbias);
}

// ---- loss -----------------------------------------------------------------------------------
// dlogits = grad_scale * (p - t) / N with t = (1-eps)*onehot + eps/K.
RN_HD inline float softmax_ce_grad(float p, bool is_label, float smoothing, int64_t classes, float grad_scale,
                                   int64_t batch) {
  const float t = (is_label ? 1.0f - smoothing : 0.0f) + smoothing / static_cast<float>(classes);
  return grad_scale * (p - t) / static_cast<float>(batch);
}

// ---- augmentation ---------------------------------------------------------------------------
// The normalisation of data/normalize.h: (v / 255 - mean) / std, in fp32.
RN_HD inline float normalize_u8(uint8_t v, float mean, float std) {
  return (static_cast<float>(v) / 255.0f - mean) / std;
}

// The source column of output column q of a crop of width `out_w` starting at `x0`,
// mirrored when `flip`.
RN_HD inline int64_t crop_flip_source_x(int64_t q, int64_t x0, int64_t out_w, bool flip) {
  return x0 + (flip ? out_w - 1 - q : q);
}

}  // namespace rn::fused

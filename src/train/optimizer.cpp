#include "train/optimizer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/thread_pool.h"

namespace rn {

void apply_optimizer_param_policy(ParamTable& table, const OptimizerConfig& cfg) {
  for (ParamView& p : table.params) {
    const bool bn_or_bias = p.kind == ParamKind::bn_gamma || p.kind == ParamKind::bn_beta ||
                            p.kind == ParamKind::conv_bias || p.kind == ParamKind::linear_bias;
    p.weight_decay = !bn_or_bias || cfg.decay_bn_and_bias;
    p.lars_adapt = !bn_or_bias;
  }
}

Optimizer::Optimizer(const OptimizerConfig& cfg, const ParamTable& table, ThreadPool* pool)
    : cfg_(cfg), table_(table), pool_(pool ? pool : &ThreadPool::global()), total_(table.total) {
  RN_CHECK(cfg.momentum >= 0 && cfg.weight_decay >= 0)
      << "Optimizer: momentum " << cfg.momentum << ", weight_decay " << cfg.weight_decay;
  const auto n = table.params.size();
  decay_.resize(n);
  adapt_.resize(n);
  trust_.assign(n, 1.0);
  for (size_t i = 0; i < n; ++i) {
    const ParamView& p = table.params[i];
    RN_CHECK(p.offset >= 0 && p.numel >= 0 && p.offset + p.numel <= table.total)
        << "Optimizer: parameter '" << p.name << "' [" << p.offset << ", " << p.offset + p.numel
        << ") lies outside the flat buffer of " << table.total << " elements";
    decay_[i] = p.weight_decay ? cfg.weight_decay : 0.0;
    adapt_[i] = cfg.name == OptimizerKind::lars && p.lars_adapt;
    for (int64_t b = p.offset; b < p.offset + p.numel; b += kSegment)
      segments_.push_back({static_cast<int32_t>(i), b, std::min(b + kSegment, p.offset + p.numel)});
  }
  seg_w2_.resize(segments_.size());
  seg_g2_.resize(segments_.size());
  momentum_.assign(static_cast<size_t>(total_), 0.0f);
}

void Optimizer::set_state(const float* data, int64_t n) {
  RN_CHECK(n == total_) << "Optimizer: restoring a momentum buffer of " << n << " elements into one of " << total_;
  std::memcpy(momentum_.data(), data, static_cast<size_t>(n) * sizeof(float));
}

namespace {

// In double, with a fixed number of independent partial sums (so the loop is not bound by
// the latency of one chain of additions) combined in a fixed order: the same bits on
// every run and thread count.
double sum_of_squares(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
  for (int l = 0; i < n; ++i, ++l) lane[l] += static_cast<double>(x[i]) * x[i];
  double total = 0;
  for (double v : lane) total += v;
  return total;
}

}  // namespace

void Optimizer::compute_trust_ratios(const float* w, const float* g, float grad_multiplier) {
  pool_->parallel_for(static_cast<int64_t>(segments_.size()), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const Segment& seg = segments_[static_cast<size_t>(s)];
      const bool adapt = adapt_[static_cast<size_t>(seg.param)];
      seg_w2_[static_cast<size_t>(s)] = adapt ? sum_of_squares(w + seg.begin, seg.end - seg.begin) : 0.0;
      seg_g2_[static_cast<size_t>(s)] = adapt ? sum_of_squares(g + seg.begin, seg.end - seg.begin) : 0.0;
    }
  });
  std::vector<double> w2(trust_.size(), 0.0), g2(trust_.size(), 0.0);
  for (size_t s = 0; s < segments_.size(); ++s) {
    w2[static_cast<size_t>(segments_[s].param)] += seg_w2_[s];
    g2[static_cast<size_t>(segments_[s].param)] += seg_g2_[s];
  }
  for (size_t p = 0; p < trust_.size(); ++p)
    trust_[p] = adapt_[p] ? lars_trust_ratio(std::sqrt(w2[p]), std::sqrt(g2[p]) * grad_multiplier, decay_[p],
                                             cfg_.lars_eta, cfg_.lars_eps)
                          : 1.0;
}

namespace {

template <bool kNesterov>
void sgd_range(float* w, float* buf, const float* g, int64_t begin, int64_t end, float gm, float wd, float lr,
               float momentum) {
  for (int64_t i = begin; i < end; ++i) sgd_update_element(w[i], buf[i], g[i] * gm, wd, lr, momentum, kNesterov);
}

template <bool kNesterov>
void lars_range(float* w, float* v, const float* g, int64_t begin, int64_t end, float gm, float wd, float scaled_lr,
                float momentum) {
  for (int64_t i = begin; i < end; ++i) lars_update_element(w[i], v[i], g[i] * gm, wd, scaled_lr, momentum, kNesterov);
}

}  // namespace

void Optimizer::step(float* weights, const float* grads, double lr, float grad_multiplier) {
  const bool lars = cfg_.name == OptimizerKind::lars;
  if (lars) compute_trust_ratios(weights, grads, grad_multiplier);
  const auto momentum = static_cast<float>(cfg_.momentum);
  float* buf = momentum_.data();
  pool_->parallel_for(static_cast<int64_t>(segments_.size()), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const Segment& seg = segments_[static_cast<size_t>(s)];
      const auto p = static_cast<size_t>(seg.param);
      if (lars) {
        const auto scaled_lr = static_cast<float>(lr * trust_[p]);
        auto range = cfg_.nesterov ? lars_range<true> : lars_range<false>;
        range(weights, buf, grads, seg.begin, seg.end, grad_multiplier, static_cast<float>(decay_[p]), scaled_lr,
              momentum);
      } else {
        auto range = cfg_.nesterov ? sgd_range<true> : sgd_range<false>;
        range(weights, buf, grads, seg.begin, seg.end, grad_multiplier, static_cast<float>(decay_[p]),
              static_cast<float>(lr), momentum);
      }
    }
  });
}

}  // namespace rn

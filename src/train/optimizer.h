// The fused optimizer: one pass over the flat fp32 parameter, gradient and momentum
// buffers (see model/params.h), reading the gradients times a multiplier (1 / loss scale)
// so that unscaling costs no pass of its own.
//
// sgd (PyTorch semantics, dampening 0), per element, wd = 0 where !ParamView::weight_decay:
//   d = g + wd * w;  buf = momentum * buf + d;  w -= lr * (nesterov ? d + momentum * buf : buf)
// lars (the MLPerf reference form; the lr lives inside the momentum buffer), per tensor:
//   ratio = eta * |w| / (|g| + wd * |w| + eps) where lars_adapt and |w|, |g| > 0, else 1
//   d = g + wd * w;  v = momentum * v + lr * ratio * d;  w -= nesterov ? momentum * v + lr * ratio * d : v
//
// The work is split into fixed segments of at most kSegment elements of one tensor each
// and spread over a thread pool; LARS norms are summed in double per segment and
// then per tensor in segment order, so results are bitwise the same for any thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/params.h"
#include "ops/fused_math.h"
#include "train/config.h"

namespace rn {

// Sets ParamView::weight_decay and lars_adapt from the config: BN gamma/beta and biases are
// not LARS-adapted and are decayed only with decay_bn_and_bias; every other tensor is both.
void apply_optimizer_param_policy(ParamTable& table, const OptimizerConfig& cfg);

// The per-element and per-tensor arithmetic lives in ops/fused_math.h, shared with the
// device's fused optimizer kernel.
using fused::lars_trust_ratio;
using fused::lars_update_element;
using fused::sgd_update_element;

class Optimizer {
 public:
  static constexpr int64_t kSegment = 1 << 15;

  // pool: where the passes run; nullptr means ThreadPool::global().
  Optimizer(const OptimizerConfig& cfg, const ParamTable& table, ThreadPool* pool = nullptr);

  // One step over every parameter view. weights, grads: table.total floats. The gradient
  // used is grads[i] * grad_multiplier (pass 1 / loss scale).
  void step(float* weights, const float* grads, double lr, float grad_multiplier = 1.0f);

  // The momentum buffer, table.total floats (0 in the alignment padding), for checkpoints.
  const std::vector<float>& state() const { return momentum_; }
  void set_state(const float* data, int64_t n);
  void set_state(const std::vector<float>& s) { set_state(s.data(), static_cast<int64_t>(s.size())); }

  // The LARS trust ratio of each parameter in the last step (1 where not adapted or sgd),
  // for the gradient monitor.
  const std::vector<double>& last_trust_ratios() const { return trust_; }
  const OptimizerConfig& config() const { return cfg_; }
  // The parameter table as given (with its weight-decay and LARS flags).
  const ParamTable& params() const { return table_; }

 private:
  struct Segment {
    int32_t param;
    int64_t begin, end;  // element range in the flat buffers
  };
  void compute_trust_ratios(const float* weights, const float* grads, float grad_multiplier);

  OptimizerConfig cfg_;
  ParamTable table_;
  ThreadPool* pool_;
  std::vector<Segment> segments_;
  std::vector<double> decay_;            // per parameter: weight_decay or 0
  std::vector<bool> adapt_;              // per parameter: LARS-adapted
  std::vector<double> trust_;            // per parameter: last trust ratio
  std::vector<double> seg_w2_, seg_g2_;  // per segment: sums of squares (scratch)
  std::vector<float> momentum_;
  int64_t total_;
};

}  // namespace rn

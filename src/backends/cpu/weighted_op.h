// The machinery shared by the CPU ops that have weights (conv2d, linear): three oneDNN
// primitives (forward, backward data, backward weights) created once, the cached reorders
// of the caller's plain-layout weights into each primitive's preferred format, and the
// fp32 staging of dw / db that is then added into the caller's gradients (dw += ...).
#pragma once

#include <algorithm>
#include <string>

#include "backends/cpu/cpu_common.h"

namespace rn::cpu {

class WeightedOp {
 public:
  WeightedOp() = default;

  // Fwd/BwdData/BwdWeights: the oneDNN primitive classes; x/y/b: the activation and bias
  // descriptors; w_user/dw_user: the caller's plain layouts; bias_elements 0: no bias.
  template <typename Fwd, typename BwdData, typename BwdWeights>
  static WeightedOp create(const ContextPtr& ctx, const std::string& op, const typename Fwd::primitive_desc& fwd_pd,
                           const typename BwdData::primitive_desc& bwd_data_pd,
                           const typename BwdWeights::primitive_desc& bwd_w_pd, const dnnl::memory::desc& x_md,
                           const dnnl::memory::desc& y_md, const dnnl::memory::desc& b_md,
                           const dnnl::memory::desc& w_user, const dnnl::memory::desc& dw_user, int64_t bias_elements) {
    WeightedOp w;
    w.ctx_ = ctx;
    w.x_md_ = x_md;
    w.y_md_ = y_md;
    w.b_md_ = b_md;
    w.bias_elements_ = bias_elements;
    TempLayout t_fwd, t_bwd_data, t_bwd_w;
    w.fwd_ = make_step<Fwd>(fwd_pd, t_fwd);
    w.w_fwd_ = WeightsIn(*ctx, w_user, fwd_pd.weights_desc(), t_fwd);
    w.bwd_data_ = make_step<BwdData>(bwd_data_pd, t_bwd_data);
    w.w_bwd_data_ = WeightsIn(*ctx, w_user, bwd_data_pd.weights_desc(), t_bwd_data);
    w.bwd_weights_ = make_step<BwdWeights>(bwd_w_pd, t_bwd_w);
    w.dw_acc_ = GradAccumulate(*ctx, bwd_w_pd.diff_weights_desc(), dw_user, t_bwd_w);
    if (bias_elements > 0) w.db_at_ = t_bwd_w.add(static_cast<size_t>(bias_elements) * sizeof(float));
    // Calls never overlap, so the three calls' temporary layouts share memory.
    ctx->reserve_temp(std::max({t_fwd.total(), t_bwd_data.total(), t_bwd_w.total()}));
    log_implementations(op, {&w.fwd_, w.w_fwd_.reorder_step(), &w.bwd_data_, w.w_bwd_data_.reorder_step(),
                             &w.bwd_weights_, w.dw_acc_.reorder_step()});
    return w;
  }

  void forward(const void* x, const void* w, const void* b, void* y) const;
  void backward_data(const void* dy, const void* w, void* dx) const;
  // dw += ..., db += ... (db may be null when there is no bias).
  void backward_weights(const void* x, const void* dy, float* dw, float* db) const;

 private:
  ContextPtr ctx_;
  dnnl::memory::desc x_md_, y_md_, b_md_;
  int64_t bias_elements_ = 0;
  Step fwd_, bwd_data_, bwd_weights_;
  WeightsIn w_fwd_, w_bwd_data_;
  GradAccumulate dw_acc_;
  size_t db_at_ = 0;
};

}  // namespace rn::cpu

// The machinery shared by the CPU ops that have weights (conv2d, linear): three oneDNN
// primitives (forward, backward data, backward weights) created once, the cached reorders
// of the caller's plain-layout weights into each primitive's preferred format, and the
// fp32 staging of dw / db that is then added into the caller's gradients (dw += ...).
// Activations pass in the caller's layout, unless a primitive was made for another (a
// Winograd convolution's blocked layout): then they are reordered in and out around it.
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
  // y_out/dx_out: the caller's y and dx where their data type is not y's and x's (a half
  // convolution with fp32 outputs); empty: y_md and x_md.
  template <typename Fwd, typename BwdData, typename BwdWeights>
  static WeightedOp create(const ContextPtr& ctx, const std::string& op, const typename Fwd::primitive_desc& fwd_pd,
                           const typename BwdData::primitive_desc& bwd_data_pd,
                           const typename BwdWeights::primitive_desc& bwd_w_pd, const dnnl::memory::desc& x_md,
                           const dnnl::memory::desc& y_md, const dnnl::memory::desc& b_md,
                           const dnnl::memory::desc& w_user, const dnnl::memory::desc& dw_user, int64_t bias_elements,
                           const dnnl::memory::desc& y_out = {}, const dnnl::memory::desc& dx_out = {}) {
    WeightedOp w;
    w.ctx_ = ctx;
    w.b_md_ = b_md;
    w.bias_elements_ = bias_elements;
    TempLayout t_fwd, t_bwd_data, t_bwd_w;
    w.fwd_ = make_step<Fwd>(fwd_pd, t_fwd);
    w.w_fwd_ = ReorderIn(*ctx, w_user, fwd_pd.weights_desc(), t_fwd);
    w.x_fwd_ = ReorderIn(*ctx, x_md, fwd_pd.src_desc(), t_fwd);
    w.y_fwd_ = ReorderOut(*ctx, fwd_pd.dst_desc(), y_out.is_zero() ? y_md : y_out, t_fwd);
    w.bwd_data_ = make_step<BwdData>(bwd_data_pd, t_bwd_data);
    w.w_bwd_data_ = ReorderIn(*ctx, w_user, bwd_data_pd.weights_desc(), t_bwd_data);
    w.dy_bwd_data_ = ReorderIn(*ctx, y_md, bwd_data_pd.diff_dst_desc(), t_bwd_data);
    w.dx_bwd_data_ = ReorderOut(*ctx, bwd_data_pd.diff_src_desc(), dx_out.is_zero() ? x_md : dx_out, t_bwd_data);
    w.bwd_weights_ = make_step<BwdWeights>(bwd_w_pd, t_bwd_w);
    w.x_bwd_w_ = ReorderIn(*ctx, x_md, bwd_w_pd.src_desc(), t_bwd_w);
    w.dy_bwd_w_ = ReorderIn(*ctx, y_md, bwd_w_pd.diff_dst_desc(), t_bwd_w);
    w.dw_acc_ = GradAccumulate(*ctx, bwd_w_pd.diff_weights_desc(), dw_user, t_bwd_w);
    if (bias_elements > 0) w.db_at_ = t_bwd_w.add(static_cast<size_t>(bias_elements) * sizeof(float));
    // Calls never overlap, so the three calls' temporary layouts share memory.
    ctx->reserve_temp(std::max({t_fwd.total(), t_bwd_data.total(), t_bwd_w.total()}));
    log_implementations(op, {&w.fwd_, w.w_fwd_.reorder_step(), w.x_fwd_.reorder_step(), w.y_fwd_.reorder_step(),
                             &w.bwd_data_, w.w_bwd_data_.reorder_step(), w.dy_bwd_data_.reorder_step(),
                             w.dx_bwd_data_.reorder_step(), &w.bwd_weights_, w.x_bwd_w_.reorder_step(),
                             w.dy_bwd_w_.reorder_step(), w.dw_acc_.reorder_step()});
    return w;
  }

  void forward(const void* x, const void* w, const void* b, void* y) const;
  void backward_data(const void* dy, const void* w, void* dx) const;
  // dw += ..., db += ... (db may be null when there is no bias).
  void backward_weights(const void* x, const void* dy, float* dw, float* db) const;
  // oneDNN's name for the forward implementation ("jit_wino_4x3:avx512_core", ...).
  const std::string& forward_implementation() const { return fwd_.impl; }

 private:
  ContextPtr ctx_;
  dnnl::memory::desc b_md_;
  int64_t bias_elements_ = 0;
  Step fwd_, bwd_data_, bwd_weights_;
  ReorderIn w_fwd_, w_bwd_data_, x_fwd_, dy_bwd_data_, x_bwd_w_, dy_bwd_w_;
  ReorderOut y_fwd_, dx_bwd_data_;
  GradAccumulate dw_acc_;
  size_t db_at_ = 0;
};

}  // namespace rn::cpu

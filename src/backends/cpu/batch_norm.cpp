// batch_norm on the CPU. NHWC activations (the CPU backend's layout) run our own loops
// (batch_norm_nhwc.h: fused add+ReLU and ReLU mask, fewer passes than oneDNN 2.6); NCHW runs
// oneDNN as below; a stats reducer (synchronised BN) runs SyncBatchNorm's loops in either.
// oneDNN (scale and shift as separate fp32 arrays, stats fp32, data in the caller's dtype):
//   forward training: oneDNN writes the batch mean into saved_mean and the biased variance
//     into saved_invstd, which we then turn into 1/sqrt(var + eps) while updating the
//     running stats (PyTorch's rule, unbiased variance var*n/(n-1)).
//   relu: fuse_norm_relu in forward (its workspace, a bit mask, is discarded); backward
//     recomputes the mask from y > 0 as the contract says, writing dy*(y>0) into dx and then
//     running the plain batch-norm backward in place on dx.
//   add_relu: oneDNN 2.6 has no fuse_norm_add_relu, so forward is batch norm then one
//     binary add + relu pass (in place on y); backward writes dy*(y>0) into dresidual, which
//     is also the batch norm's incoming gradient.
//   recompute (memory level O2): the training primitive again on the same input, with the
//     statistics going to scratch instead of the saved/running ones; oneDNN's reduction
//     order is fixed for a fixed thread count, so y comes out the same bits, and the
//     scratch statistics are compared with the saved ones to prove it.
//   backward: oneDNN wants the variance, recovered as 1/invstd^2 - eps; dgamma and dbeta are
//     staged and then added (parameter gradients accumulate).
//   synchronised (a stats reducer set): oneDNN cannot reduce its statistics over ranks, so
//     training forward, recompute and backward run SyncBatchNorm's loops instead
//     (batch_norm_sync.h); inference ignores the reducer.
#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>

#include "backends/cpu/batch_norm_nhwc.h"
#include "backends/cpu/batch_norm_sync.h"
#include "backends/cpu/cpu_common.h"
#include "core/log.h"

namespace rn::cpu {
namespace {

using bn_fwd_t = dnnl::batch_normalization_forward;
using bn_bwd_t = dnnl::batch_normalization_backward;
using flags = dnnl::normalization_flags;

class CpuBatchNorm final : public BatchNormKernel {
 public:
  CpuBatchNorm(const ContextPtr& ctx, const BatchNormDesc& d);

 protected:
  void do_set_stats_reducer(BatchStatsReducer* r) override {
    if (r == nullptr)
      sync_.reset();
    else if (!sync_)
      sync_ = std::make_unique<SyncBatchNorm>(desc_);
  }
  void do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                           const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var) override;
  void do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) override;
  void do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) override;
  void do_backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                   const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                   const Tensor& saved_invstd) override;

 private:
  ContextPtr ctx_;
  dnnl::memory::desc data_md_, stat_md_, ws_md_;
  Step train_, infer_, bwd_;
  size_t ws_at_ = 0;  // forward training: discarded relu workspace
  size_t re_mean_at_ = 0, re_var_at_ = 0;  // recompute: scratch batch statistics
  // backward: variance, staged dgamma and dbeta, and an unread shift (oneDNN 2.6 demands a
  // SHIFT argument with use_shift although the gradient does not depend on beta)
  size_t var_at_ = 0, dscale_at_ = 0, dshift_at_ = 0, shift_at_ = 0;
  AddElementwise add_relu_;  // add_relu forward post-pass
  ReluMask relu_mask_;       // relu / add_relu backward pre-pass
  std::unique_ptr<SyncBatchNorm> sync_;  // set iff a stats reducer is
  std::unique_ptr<NhwcBatchNorm> nhwc_;  // NHWC: our loops instead of oneDNN
};

CpuBatchNorm::CpuBatchNorm(const ContextPtr& ctx, const BatchNormDesc& d) : BatchNormKernel(d), ctx_(ctx) {
  const std::string op = d.str();
  if (d.layout == Layout::nhwc && ctx->batch_norm_loops()) {
    nhwc_ = std::make_unique<NhwcBatchNorm>(d);
    RN_LOG_DEBUG("cpu backend: {}: nhwc loops ({})", op, NhwcBatchNorm::isa());
    return;
  }
  const auto& eng = ctx->engine();
  const auto attr = user_scratchpad_attr();
  data_md_ = activation_md(d.x_shape(), d.dtype, d.layout);
  stat_md_ = dnnl::memory::desc({d.channels}, dt::f32, tag::a);
  const flags affine = flags::use_scale | flags::use_shift;
  const flags relu = d.fuse == BnFuse::relu ? flags::fuse_norm_relu : flags::none;

  TempLayout t_train, t_infer, t_bwd;
  const auto train_pd = make_pd<bn_fwd_t::primitive_desc>(
      op, "training batch normalization",
      bn_fwd_t::desc(dnnl::prop_kind::forward_training, data_md_, d.eps, affine | relu), attr, eng);
  train_ = make_step<bn_fwd_t>(train_pd, t_train);
  ws_md_ = train_pd.workspace_desc();
  ws_at_ = t_train.add(ws_md_.get_size());
  const size_t stat_bytes = static_cast<size_t>(d.channels) * sizeof(float);
  re_mean_at_ = t_train.add(stat_bytes);
  re_var_at_ = t_train.add(stat_bytes);

  const auto infer_pd = make_pd<bn_fwd_t::primitive_desc>(
      op, "inference batch normalization",
      bn_fwd_t::desc(dnnl::prop_kind::forward_inference, data_md_, d.eps, affine | relu | flags::use_global_stats),
      attr, eng);
  infer_ = make_step<bn_fwd_t>(infer_pd, t_infer);

  // The backward runs without fuse_norm_relu (the mask is applied beforehand), so its hint
  // is a forward without it too.
  const auto hint_pd = make_pd<bn_fwd_t::primitive_desc>(
      op, "training batch normalization", bn_fwd_t::desc(dnnl::prop_kind::forward_training, data_md_, d.eps, affine),
      attr, eng);
  const auto bwd_pd = make_pd<bn_bwd_t::primitive_desc>(
      op, "backward batch normalization", bn_bwd_t::desc(dnnl::prop_kind::backward, data_md_, data_md_, d.eps, affine),
      attr, eng, hint_pd);
  bwd_ = make_step<bn_bwd_t>(bwd_pd, t_bwd);
  var_at_ = t_bwd.add(stat_bytes);
  dscale_at_ = t_bwd.add(stat_bytes);
  dshift_at_ = t_bwd.add(stat_bytes);
  shift_at_ = t_bwd.add(stat_bytes);

  const int64_t numel = d.x_shape().numel();
  if (d.fuse == BnFuse::add_relu) {
    add_relu_ = AddElementwise(*ctx, numel, d.dtype, /*relu=*/true, op, t_train);
  }
  if (d.fuse != BnFuse::none) relu_mask_ = ReluMask(*ctx, numel, d.dtype, op, t_bwd);
  ctx->reserve_temp(std::max({t_train.total(), t_infer.total(), t_bwd.total()}));
  log_implementations(op, {&train_, &infer_, &bwd_, d.fuse == BnFuse::add_relu ? add_relu_.step() : nullptr,
                           d.fuse != BnFuse::none ? relu_mask_.step() : nullptr});
}

void CpuBatchNorm::do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd,
                                       const Tensor& x, const Tensor* residual, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var) {
  if (sync_) {
    sync_->forward_training(*stats_reducer(), y, saved_mean, saved_invstd, x, residual, gamma, beta, running_mean,
                            running_var);
    return;
  }
  if (nhwc_) {
    nhwc_->forward_training(y, saved_mean, saved_invstd, x, residual, gamma, beta, running_mean, running_var);
    return;
  }
  const int64_t n = desc_.batch * desc_.h * desc_.w;
  RN_CHECK(n > 1) << desc_.str() << ": training needs more than one value per channel (N*H*W = " << n << ")";
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, wrap(c, data_md_, x.data)},           {DNNL_ARG_DST, wrap(c, data_md_, y.data)},
      {DNNL_ARG_SCALE, wrap(c, stat_md_, gamma.data)},     {DNNL_ARG_SHIFT, wrap(c, stat_md_, beta.data)},
      {DNNL_ARG_MEAN, wrap(c, stat_md_, saved_mean.data)}, {DNNL_ARG_VARIANCE, wrap(c, stat_md_, saved_invstd.data)}};
  if (ws_md_.get_size() > 0) args.emplace(DNNL_ARG_WORKSPACE, wrap_temp(c, ws_md_, ws_at_));
  execute(c, train_, std::move(args));
  if (residual != nullptr) add_relu_.run(c, y.data, y.data, residual->data);

  // saved_invstd holds the biased variance here.
  const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
  const float m = desc_.momentum;
  const float* mean = saved_mean.ptr<float>();
  float* invstd = saved_invstd.ptr<float>();
  float* rmean = running_mean.ptr<float>();
  float* rvar = running_var.ptr<float>();
  for (int64_t ch = 0; ch < desc_.channels; ++ch) {
    const float var = invstd[ch];
    rmean[ch] = (1.0f - m) * rmean[ch] + m * mean[ch];
    rvar[ch] = (1.0f - m) * rvar[ch] + m * static_cast<float>(var * unbias);
    invstd[ch] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(var) + desc_.eps));
  }
}

void CpuBatchNorm::do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                        const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) {
  if (nhwc_) {
    nhwc_->forward_inference(y, x, residual, gamma, beta, running_mean, running_var);
    return;
  }
  Context& c = *ctx_;
  execute(c, infer_,
          {{DNNL_ARG_SRC, wrap(c, data_md_, x.data)},
           {DNNL_ARG_DST, wrap(c, data_md_, y.data)},
           {DNNL_ARG_SCALE, wrap(c, stat_md_, gamma.data)},
           {DNNL_ARG_SHIFT, wrap(c, stat_md_, beta.data)},
           {DNNL_ARG_MEAN, wrap(c, stat_md_, running_mean.data)},
           {DNNL_ARG_VARIANCE, wrap(c, stat_md_, running_var.data)}});
  if (residual != nullptr) add_relu_.run(c, y.data, y.data, residual->data);
}

void CpuBatchNorm::do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                        const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) {
  if (sync_) {
    sync_->forward_recompute(y, x, residual, gamma, beta, saved_mean, saved_invstd);
    return;
  }
  if (nhwc_) {
    nhwc_->forward_recompute(y, x, residual, gamma, beta, saved_mean, saved_invstd);
    return;
  }
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, wrap(c, data_md_, x.data)},
                                                {DNNL_ARG_DST, wrap(c, data_md_, y.data)},
                                                {DNNL_ARG_SCALE, wrap(c, stat_md_, gamma.data)},
                                                {DNNL_ARG_SHIFT, wrap(c, stat_md_, beta.data)},
                                                {DNNL_ARG_MEAN, wrap_temp(c, stat_md_, re_mean_at_)},
                                                {DNNL_ARG_VARIANCE, wrap_temp(c, stat_md_, re_var_at_)}};
  if (ws_md_.get_size() > 0) args.emplace(DNNL_ARG_WORKSPACE, wrap_temp(c, ws_md_, ws_at_));
  execute(c, train_, std::move(args));
  if (residual != nullptr) add_relu_.run(c, y.data, y.data, residual->data);

  // The statistics must be the saved ones, bit for bit (invstd as forward_training made it).
  // Bits, not ==: a NaN statistic (an overflowing step that will be skipped) recomputes too.
  const float* mean = reinterpret_cast<const float*>(c.temp() + re_mean_at_);
  const float* var = reinterpret_cast<const float*>(c.temp() + re_var_at_);
  for (int64_t ch = 0; ch < desc_.channels; ++ch) {
    const float invstd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(var[ch]) + desc_.eps));
    RN_CHECK(std::bit_cast<uint32_t>(mean[ch]) == std::bit_cast<uint32_t>(saved_mean.ptr<float>()[ch]) &&
             std::bit_cast<uint32_t>(invstd) == std::bit_cast<uint32_t>(saved_invstd.ptr<float>()[ch]))
        << desc_.str() << ": recomputed batch statistics of channel " << ch
        << " differ from the saved ones (the input changed since forward_training)";
  }
}

void CpuBatchNorm::do_backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                               const Tensor& saved_mean, const Tensor& saved_invstd) {
  if (sync_) {
    sync_->backward(*stats_reducer(), dx, dresidual, dgamma, dbeta, dy, x, y, gamma, saved_mean, saved_invstd);
    return;
  }
  if (nhwc_) {
    nhwc_->backward(dx, dresidual, dgamma, dbeta, dy, x, y, gamma, saved_mean, saved_invstd);
    return;
  }
  Context& c = *ctx_;
  // The gradient reaching the batch norm itself: dy, or dy*(y>0) written into dresidual
  // (add_relu: that is dresidual's value too) or into dx (relu: then normalised in place).
  const void* dbn = dy.data;
  if (desc_.fuse != BnFuse::none) {
    void* masked = dresidual != nullptr ? dresidual->data : dx.data;
    relu_mask_.run(c, masked, dy.data, y.data);
    dbn = masked;
  }
  float* var = reinterpret_cast<float*>(c.temp() + var_at_);
  const float* invstd = saved_invstd.ptr<float>();
  for (int64_t ch = 0; ch < desc_.channels; ++ch) {
    const double s = invstd[ch];
    var[ch] = static_cast<float>(1.0 / (s * s) - desc_.eps);
  }
  execute(c, bwd_,
          {{DNNL_ARG_SRC, wrap(c, data_md_, x.data)},
           {DNNL_ARG_DIFF_DST, wrap(c, data_md_, dbn)},
           {DNNL_ARG_MEAN, wrap(c, stat_md_, saved_mean.data)},
           {DNNL_ARG_VARIANCE, wrap_temp(c, stat_md_, var_at_)},
           {DNNL_ARG_SCALE, wrap(c, stat_md_, gamma.data)},
           {DNNL_ARG_SHIFT, wrap_temp(c, stat_md_, shift_at_)},
           {DNNL_ARG_DIFF_SRC, wrap(c, data_md_, dx.data)},
           {DNNL_ARG_DIFF_SCALE, wrap_temp(c, stat_md_, dscale_at_)},
           {DNNL_ARG_DIFF_SHIFT, wrap_temp(c, stat_md_, dshift_at_)}});
  add_to(dgamma.ptr<float>(), reinterpret_cast<const float*>(c.temp() + dscale_at_), desc_.channels);
  add_to(dbeta.ptr<float>(), reinterpret_cast<const float*>(c.temp() + dshift_at_), desc_.channels);
}

}  // namespace

bool batch_norm_half_io(const Context& ctx, Layout layout, DType half) {
  return layout == Layout::nhwc && half == DType::bf16 && ctx.batch_norm_loops() && ctx.supports_dtype(half, nullptr);
}

std::unique_ptr<BatchNormKernel> make_batch_norm(const ContextPtr& ctx, const BatchNormDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  if (d.mixed()) {
    ctx->require_compute_dtype(d.half, d.str());  // the machine's reason first, where it has no bf16
    if (!batch_norm_half_io(*ctx, d.layout, d.half))
      RN_UNSUPPORTED() << d.str() << ": a bf16 y or dx from fp32 x is for the NHWC loops only (not oneDNN's)";
  }
  return std::make_unique<CpuBatchNorm>(ctx, d);
}

}  // namespace rn::cpu

// Pooling on oneDNN, in the caller's layout.
//   max_pool2d: pooling_max forward_training; the workspace is oneDNN's own (argmax
//     positions in an implementation-defined encoding), so workspace_bytes() asks the
//     primitive. Padding is symmetric: oneDNN ignores padded positions for max.
//   global_avg_pool: one average pooling window covering H x W; y [N, C] is the same
//     memory as a [N, C, 1, 1] tensor in either layout.
#include "backends/cpu/cpu_common.h"

namespace rn::cpu {
namespace {

using pool_fwd_t = dnnl::pooling_forward;
using pool_bwd_t = dnnl::pooling_backward;

class CpuMaxPool final : public MaxPoolKernel {
 public:
  CpuMaxPool(const ContextPtr& ctx, const MaxPoolDesc& d) : MaxPoolKernel(d), ctx_(ctx) {
    const std::string op = d.str();
    x_md_ = activation_md(d.x_shape(), d.dtype, d.layout);
    y_md_ = activation_md(d.y_shape(), d.dtype, d.layout);
    const dims strides = {d.stride, d.stride}, kernel = {d.kernel, d.kernel}, pad = {d.pad, d.pad};
    const auto attr = user_scratchpad_attr();
    const auto alg = dnnl::algorithm::pooling_max;
    const auto fwd_pd = make_pd<pool_fwd_t::primitive_desc>(
        op, "max pooling forward",
        pool_fwd_t::desc(dnnl::prop_kind::forward_training, alg, x_md_, y_md_, strides, kernel, pad, pad), attr,
        ctx->engine());
    const auto bwd_pd = make_pd<pool_bwd_t::primitive_desc>(
        op, "max pooling backward", pool_bwd_t::desc(alg, x_md_, y_md_, strides, kernel, pad, pad), attr, ctx->engine(),
        fwd_pd);
    ws_md_ = fwd_pd.workspace_desc();
    TempLayout t_fwd, t_bwd;
    fwd_ = make_step<pool_fwd_t>(fwd_pd, t_fwd);
    bwd_ = make_step<pool_bwd_t>(bwd_pd, t_bwd);
    ctx->reserve_temp(std::max(t_fwd.total(), t_bwd.total()));
    log_implementations(op, {&fwd_, &bwd_});
  }
  size_t workspace_bytes() const override { return ws_md_.get_size(); }

 protected:
  void do_forward(const Tensor& y, const Tensor& workspace, const Tensor& x) override {
    Context& c = *ctx_;
    execute(c, fwd_,
            {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)},
             {DNNL_ARG_DST, wrap(c, y_md_, y.data)},
             {DNNL_ARG_WORKSPACE, wrap(c, ws_md_, workspace.data)}});
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace) override {
    Context& c = *ctx_;
    execute(c, bwd_,
            {{DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)},
             {DNNL_ARG_DIFF_SRC, wrap(c, x_md_, dx.data)},
             {DNNL_ARG_WORKSPACE, wrap(c, ws_md_, workspace.data)}});
  }

 private:
  ContextPtr ctx_;
  dnnl::memory::desc x_md_, y_md_, ws_md_;
  Step fwd_, bwd_;
};

class CpuGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  CpuGlobalAvgPool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d) : GlobalAvgPoolKernel(d), ctx_(ctx) {
    const std::string op = d.str();
    x_md_ = activation_md(d.x_shape(), d.dtype, d.layout);
    y_md_ = activation_md({d.batch, d.channels, 1, 1}, d.dtype, d.layout);
    const dims window = {d.h, d.w}, zero = {0, 0};
    const auto attr = user_scratchpad_attr();
    const auto alg = dnnl::algorithm::pooling_avg_exclude_padding;
    const auto fwd_pd = make_pd<pool_fwd_t::primitive_desc>(
        op, "average pooling forward",
        pool_fwd_t::desc(dnnl::prop_kind::forward_training, alg, x_md_, y_md_, window, window, zero, zero), attr,
        ctx->engine());
    const auto bwd_pd = make_pd<pool_bwd_t::primitive_desc>(
        op, "average pooling backward", pool_bwd_t::desc(alg, x_md_, y_md_, window, window, zero, zero), attr,
        ctx->engine(), fwd_pd);
    TempLayout t_fwd, t_bwd;
    fwd_ = make_step<pool_fwd_t>(fwd_pd, t_fwd);
    bwd_ = make_step<pool_bwd_t>(bwd_pd, t_bwd);
    ctx->reserve_temp(std::max(t_fwd.total(), t_bwd.total()));
    log_implementations(op, {&fwd_, &bwd_});
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    Context& c = *ctx_;
    execute(c, fwd_, {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)}, {DNNL_ARG_DST, wrap(c, y_md_, y.data)}});
  }
  void do_backward(const Tensor& dx, const Tensor& dy) override {
    Context& c = *ctx_;
    execute(c, bwd_, {{DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)}, {DNNL_ARG_DIFF_SRC, wrap(c, x_md_, dx.data)}});
  }

 private:
  ContextPtr ctx_;
  dnnl::memory::desc x_md_, y_md_;
  Step fwd_, bwd_;
};

}  // namespace

std::unique_ptr<MaxPoolKernel> make_max_pool(const ContextPtr& ctx, const MaxPoolDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuMaxPool>(ctx, d);
}

std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuGlobalAvgPool>(ctx, d);
}

}  // namespace rn::cpu

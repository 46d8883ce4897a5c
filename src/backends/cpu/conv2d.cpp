// conv2d on oneDNN: three primitives (forward, backward data, backward weights) created
// once per descriptor. Activations stay in the caller's layout (nhwc is the fast one: no
// activation reorder ever happens); weights use the format each primitive prefers (`any`),
// reordered from PyTorch's OIHW (GOIHW with groups) at each call only when it differs.
// dw, db are computed into fp32 staging memory and then added to the caller's (dw += ...).
#include <algorithm>

#include "backends/cpu/cpu_common.h"

namespace rn::cpu {
namespace {

class CpuConv2d final : public Conv2dKernel {
 public:
  CpuConv2d(const ContextPtr& ctx, const Conv2dDesc& d);

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override;
  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override;
  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override;

 private:
  ContextPtr ctx_;
  dnnl::memory::desc x_md_, y_md_, b_md_, w_user_md_, dw_user_md_;
  Step fwd_, bwd_data_, bwd_weights_;
  WeightsIn w_fwd_, w_bwd_data_;
  GradAccumulate dw_acc_;
  size_t db_at_ = 0;
};

// Weights of logical shape [K, C/G, R, S]; with groups oneDNN wants [G, K/G, C/G, R, S],
// which is the same memory in goihw.
dims weight_dims(const Conv2dDesc& d) {
  const auto& p = d.p;
  if (p.groups == 1) return {p.out_channels, p.in_channels, p.kernel_h, p.kernel_w};
  return {p.groups, p.out_channels / p.groups, p.in_channels / p.groups, p.kernel_h, p.kernel_w};
}

CpuConv2d::CpuConv2d(const ContextPtr& ctx, const Conv2dDesc& d) : Conv2dKernel(d), ctx_(ctx) {
  const std::string op = d.str();
  const auto& p = d.p;
  const dims wd = weight_dims(d);
  const tag wtag = p.groups == 1 ? tag::oihw : tag::goihw;
  const dt wdt = to_dnnl(d.dtype);

  x_md_ = activation_md(d.x_shape(), d.dtype, d.layout);
  y_md_ = activation_md(d.y_shape(), d.dtype, d.layout);
  if (p.bias) b_md_ = dnnl::memory::desc({p.out_channels}, dt::f32, tag::a);
  w_user_md_ = dnnl::memory::desc(wd, wdt, wtag);
  dw_user_md_ = dnnl::memory::desc(wd, dt::f32, wtag);
  const dnnl::memory::desc w_any(wd, wdt, tag::any), dw_any(wd, dt::f32, tag::any);

  const dims strides = {p.stride_h, p.stride_w};
  const dims dilates = {p.dilation_h - 1, p.dilation_w - 1};  // oneDNN counts the gaps
  // Symmetric padding: the output size is floor((in + 2p - span) / stride) + 1 in both
  // conventions, so oneDNN's consistency check holds; rows past the last window are unused.
  const dims pad = {p.pad_h, p.pad_w};
  const auto& eng = ctx->engine();
  const auto attr = user_scratchpad_attr();
  const auto alg = dnnl::algorithm::convolution_direct;

  using fwd_t = dnnl::convolution_forward;
  using bwd_data_t = dnnl::convolution_backward_data;
  using bwd_w_t = dnnl::convolution_backward_weights;
  const fwd_t::desc fwd_desc(dnnl::prop_kind::forward_training, alg, x_md_, w_any, b_md_, y_md_, strides, dilates, pad,
                             pad);
  const auto fwd_pd = make_pd<fwd_t::primitive_desc>(op, "forward convolution", fwd_desc, attr, eng);
  const bwd_data_t::desc bwd_data_desc(alg, x_md_, w_any, y_md_, strides, dilates, pad, pad);
  const auto bwd_data_pd =
      make_pd<bwd_data_t::primitive_desc>(op, "backward-data convolution", bwd_data_desc, attr, eng, fwd_pd);
  const dnnl::memory::desc db_md = p.bias ? dnnl::memory::desc({p.out_channels}, dt::f32, tag::a) : b_md_;
  const bwd_w_t::desc bwd_w_desc(alg, x_md_, dw_any, db_md, y_md_, strides, dilates, pad, pad);
  const auto bwd_w_pd =
      make_pd<bwd_w_t::primitive_desc>(op, "backward-weights convolution", bwd_w_desc, attr, eng, fwd_pd);

  // Each call's temporary memory: the primitive's scratchpad plus reordered weights or
  // staged gradients. Calls never overlap, so the three layouts overlap in memory.
  TempLayout t_fwd, t_bwd_data, t_bwd_w;
  fwd_ = make_step<fwd_t>(fwd_pd, t_fwd);
  w_fwd_ = WeightsIn(*ctx, w_user_md_, fwd_pd.weights_desc(), t_fwd);
  bwd_data_ = make_step<bwd_data_t>(bwd_data_pd, t_bwd_data);
  w_bwd_data_ = WeightsIn(*ctx, w_user_md_, bwd_data_pd.weights_desc(), t_bwd_data);
  bwd_weights_ = make_step<bwd_w_t>(bwd_w_pd, t_bwd_w);
  dw_acc_ = GradAccumulate(*ctx, bwd_w_pd.diff_weights_desc(), dw_user_md_, t_bwd_w);
  if (p.bias) db_at_ = t_bwd_w.add(static_cast<size_t>(p.out_channels) * sizeof(float));
  ctx->reserve_temp(std::max({t_fwd.total(), t_bwd_data.total(), t_bwd_w.total()}));
  log_implementations(op, {&fwd_, w_fwd_.reorder_step(), &bwd_data_, w_bwd_data_.reorder_step(), &bwd_weights_,
                           dw_acc_.reorder_step()});
}

void CpuConv2d::do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)},
                                                {DNNL_ARG_WEIGHTS, w_fwd_.prepare(c, w.data)},
                                                {DNNL_ARG_DST, wrap(c, y_md_, y.data)}};
  if (b != nullptr) args.emplace(DNNL_ARG_BIAS, wrap(c, b_md_, b->data));
  execute(c, fwd_, std::move(args));
}

void CpuConv2d::do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  Context& c = *ctx_;
  execute(c, bwd_data_,
          {{DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)},
           {DNNL_ARG_WEIGHTS, w_bwd_data_.prepare(c, w.data)},
           {DNNL_ARG_DIFF_SRC, wrap(c, x_md_, dx.data)}});
}

void CpuConv2d::do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)},
                                                {DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)},
                                                {DNNL_ARG_DIFF_WEIGHTS, dw_acc_.staging(c)}};
  if (db != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, wrap_temp(c, b_md_, db_at_));
  execute(c, bwd_weights_, std::move(args));
  dw_acc_.accumulate(c, dw.data);
  if (db != nullptr) add_to(db->ptr<float>(), reinterpret_cast<const float*>(c.temp() + db_at_), desc_.p.out_channels);
}

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const ContextPtr& ctx, const Conv2dDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuConv2d>(ctx, d);
}

}  // namespace rn::cpu

// linear on oneDNN inner product: x [N, I] and y [N, O] plain, w in the format each
// primitive prefers (reordered from PyTorch's [O, I] only when it differs), dw staged in
// fp32 and added to the caller's (dw += ...), db staged and added.
#include <algorithm>

#include "backends/cpu/cpu_common.h"

namespace rn::cpu {
namespace {

using fwd_t = dnnl::inner_product_forward;
using bwd_data_t = dnnl::inner_product_backward_data;
using bwd_w_t = dnnl::inner_product_backward_weights;

class CpuLinear final : public LinearKernel {
 public:
  CpuLinear(const ContextPtr& ctx, const LinearDesc& d);

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override;
  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override;
  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override;

 private:
  ContextPtr ctx_;
  dnnl::memory::desc x_md_, y_md_, b_md_;
  Step fwd_, bwd_data_, bwd_weights_;
  WeightsIn w_fwd_, w_bwd_data_;
  GradAccumulate dw_acc_;
  size_t db_at_ = 0;
};

CpuLinear::CpuLinear(const ContextPtr& ctx, const LinearDesc& d) : LinearKernel(d), ctx_(ctx) {
  const std::string op = d.str();
  const dt adt = to_dnnl(d.dtype);
  x_md_ = dnnl::memory::desc({d.batch, d.in_features}, adt, tag::ab);
  y_md_ = dnnl::memory::desc({d.batch, d.out_features}, adt, tag::ab);
  if (d.bias) b_md_ = dnnl::memory::desc({d.out_features}, dt::f32, tag::a);
  const dims wd = {d.out_features, d.in_features};
  const dnnl::memory::desc w_user(wd, adt, tag::ab), dw_user(wd, dt::f32, tag::ab);
  const dnnl::memory::desc w_any(wd, adt, tag::any), dw_any(wd, dt::f32, tag::any);
  const auto attr = user_scratchpad_attr();
  const auto& eng = ctx->engine();

  const auto fwd_pd = make_pd<fwd_t::primitive_desc>(
      op, "inner product forward", fwd_t::desc(dnnl::prop_kind::forward_training, x_md_, w_any, b_md_, y_md_), attr,
      eng);
  const auto bwd_data_pd = make_pd<bwd_data_t::primitive_desc>(
      op, "inner product backward data", bwd_data_t::desc(x_md_, w_any, y_md_), attr, eng, fwd_pd);
  const auto bwd_w_pd = make_pd<bwd_w_t::primitive_desc>(op, "inner product backward weights",
                                                         bwd_w_t::desc(x_md_, dw_any, b_md_, y_md_), attr, eng, fwd_pd);

  TempLayout t_fwd, t_bwd_data, t_bwd_w;
  fwd_ = make_step<fwd_t>(fwd_pd, t_fwd);
  w_fwd_ = WeightsIn(*ctx, w_user, fwd_pd.weights_desc(), t_fwd);
  bwd_data_ = make_step<bwd_data_t>(bwd_data_pd, t_bwd_data);
  w_bwd_data_ = WeightsIn(*ctx, w_user, bwd_data_pd.weights_desc(), t_bwd_data);
  bwd_weights_ = make_step<bwd_w_t>(bwd_w_pd, t_bwd_w);
  dw_acc_ = GradAccumulate(*ctx, bwd_w_pd.diff_weights_desc(), dw_user, t_bwd_w);
  if (d.bias) db_at_ = t_bwd_w.add(static_cast<size_t>(d.out_features) * sizeof(float));
  ctx->reserve_temp(std::max({t_fwd.total(), t_bwd_data.total(), t_bwd_w.total()}));
  log_implementations(op, {&fwd_, w_fwd_.reorder_step(), &bwd_data_, w_bwd_data_.reorder_step(), &bwd_weights_,
                           dw_acc_.reorder_step()});
}

void CpuLinear::do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)},
                                                {DNNL_ARG_WEIGHTS, w_fwd_.prepare(c, w.data)},
                                                {DNNL_ARG_DST, wrap(c, y_md_, y.data)}};
  if (b != nullptr) args.emplace(DNNL_ARG_BIAS, wrap(c, b_md_, b->data));
  execute(c, fwd_, std::move(args));
}

void CpuLinear::do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  Context& c = *ctx_;
  execute(c, bwd_data_,
          {{DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)},
           {DNNL_ARG_WEIGHTS, w_bwd_data_.prepare(c, w.data)},
           {DNNL_ARG_DIFF_SRC, wrap(c, x_md_, dx.data)}});
}

void CpuLinear::do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, wrap(c, x_md_, x.data)},
                                                {DNNL_ARG_DIFF_DST, wrap(c, y_md_, dy.data)},
                                                {DNNL_ARG_DIFF_WEIGHTS, dw_acc_.staging(c)}};
  if (db != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, wrap_temp(c, b_md_, db_at_));
  execute(c, bwd_weights_, std::move(args));
  dw_acc_.accumulate(c, dw.data);
  if (db != nullptr) add_to(db->ptr<float>(), reinterpret_cast<const float*>(c.temp() + db_at_), desc_.out_features);
}

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const ContextPtr& ctx, const LinearDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuLinear>(ctx, d);
}

}  // namespace rn::cpu

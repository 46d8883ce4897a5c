// linear on oneDNN inner product: x [N, I] and y [N, O] plain, w in the format each
// primitive prefers (reordered from PyTorch's [O, I] only when it differs), dw staged in
// fp32 and added to the caller's (dw += ...), db staged and added.
#include "backends/cpu/weighted_op.h"

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
  WeightedOp op_;
};

CpuLinear::CpuLinear(const ContextPtr& ctx, const LinearDesc& d) : LinearKernel(d) {
  const std::string op = d.str();
  const dt adt = to_dnnl(d.dtype);
  const dnnl::memory::desc x_md({d.batch, d.in_features}, adt, tag::ab), y_md({d.batch, d.out_features}, adt, tag::ab);
  const dnnl::memory::desc b_md = d.bias ? dnnl::memory::desc({d.out_features}, dt::f32, tag::a) : dnnl::memory::desc();
  const dims wd = {d.out_features, d.in_features};
  const dnnl::memory::desc w_user(wd, adt, tag::ab), dw_user(wd, dt::f32, tag::ab);
  const dnnl::memory::desc w_any(wd, adt, tag::any), dw_any(wd, dt::f32, tag::any);
  const auto attr = user_scratchpad_attr();
  const auto& eng = ctx->engine();

  const auto fwd_pd = make_pd<fwd_t::primitive_desc>(
      op, "inner product forward", fwd_t::desc(dnnl::prop_kind::forward_training, x_md, w_any, b_md, y_md), attr, eng);
  const auto bwd_data_pd = make_pd<bwd_data_t::primitive_desc>(op, "inner product backward data",
                                                               bwd_data_t::desc(x_md, w_any, y_md), attr, eng, fwd_pd);
  const auto bwd_w_pd = make_pd<bwd_w_t::primitive_desc>(op, "inner product backward weights",
                                                         bwd_w_t::desc(x_md, dw_any, b_md, y_md), attr, eng, fwd_pd);

  op_ = WeightedOp::create<fwd_t, bwd_data_t, bwd_w_t>(ctx, op, fwd_pd, bwd_data_pd, bwd_w_pd, x_md, y_md, b_md, w_user,
                                                       dw_user, d.bias ? d.out_features : 0);
}

void CpuLinear::do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  op_.forward(x.data, w.data, b ? b->data : nullptr, y.data);
}

void CpuLinear::do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  op_.backward_data(dy.data, w.data, dx.data);
}

void CpuLinear::do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  op_.backward_weights(x.data, dy.data, dw.ptr<float>(), db ? db->ptr<float>() : nullptr);
}

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const ContextPtr& ctx, const LinearDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuLinear>(ctx, d);
}

}  // namespace rn::cpu

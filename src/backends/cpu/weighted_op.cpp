#include "backends/cpu/weighted_op.h"

namespace rn::cpu {

void WeightedOp::forward(const void* x, const void* w, const void* b, void* y) const {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, x_fwd_.prepare(c, x)},
                                                {DNNL_ARG_WEIGHTS, w_fwd_.prepare(c, w)},
                                                {DNNL_ARG_DST, y_fwd_.target(c, y)}};
  if (b != nullptr) args.emplace(DNNL_ARG_BIAS, wrap(c, b_md_, b));
  execute(c, fwd_, std::move(args));
  y_fwd_.finish(c, y);
}

void WeightedOp::backward_data(const void* dy, const void* w, void* dx) const {
  Context& c = *ctx_;
  execute(c, bwd_data_,
          {{DNNL_ARG_DIFF_DST, dy_bwd_data_.prepare(c, dy)},
           {DNNL_ARG_WEIGHTS, w_bwd_data_.prepare(c, w)},
           {DNNL_ARG_DIFF_SRC, dx_bwd_data_.target(c, dx)}});
  dx_bwd_data_.finish(c, dx);
}

void WeightedOp::backward_weights(const void* x, const void* dy, float* dw, float* db) const {
  Context& c = *ctx_;
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, x_bwd_w_.prepare(c, x)},
                                                {DNNL_ARG_DIFF_DST, dy_bwd_w_.prepare(c, dy)},
                                                {DNNL_ARG_DIFF_WEIGHTS, dw_acc_.staging(c)}};
  if (db != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, wrap_temp(c, b_md_, db_at_));
  execute(c, bwd_weights_, std::move(args));
  dw_acc_.accumulate(c, dw);
  if (db != nullptr) add_to(db, reinterpret_cast<const float*>(c.temp() + db_at_), bias_elements_);
}

}  // namespace rn::cpu

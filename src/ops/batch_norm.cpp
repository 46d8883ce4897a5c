#include "ops/batch_norm.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

std::string_view bn_fuse_name(BnFuse f) {
  switch (f) {
    case BnFuse::none: return "none";
    case BnFuse::relu: return "relu";
    case BnFuse::add_relu: return "add_relu";
  }
  return "?";
}

void BatchNormDesc::validate() const {
  RN_CHECK(batch > 0 && channels > 0 && h > 0 && w > 0) << "batch_norm: empty input in " << str();
  RN_CHECK(eps > 0.0f) << "batch_norm: eps must be positive in " << str();
  RN_CHECK(momentum >= 0.0f && momentum <= 1.0f) << "batch_norm: momentum must be in [0, 1] in " << str();
  RN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16)
      << "batch_norm: dtype must be floating in " << str();
  if (mixed()) {
    RN_CHECK(dtype == DType::f32 && (half == DType::bf16 || half == DType::f16))
        << "batch_norm: a half y or dx is for fp32 x and a bf16 or fp16 half, in " << str();
    RN_CHECK(fuse != BnFuse::relu || half_y == half_dx)
        << "batch_norm: with the ReLU alone, y and dx must share a dtype (backward keeps dy*(y>0) in dx), in " << str();
  }
  // Past this every size and offset computation wraps. The output has the input's shape.
  RN_CHECK(shape_bytes_fit(x_shape(), dtype))
      << "batch_norm: the input " << x_shape().str() << " has more bytes than a 64-bit size holds in " << str()
      << ": lower the batch size or the input size";
}

std::string BatchNormDesc::str() const {
  std::ostringstream s;
  s << "batch_norm(" << dtype_name(dtype) << " " << layout_name(layout) << " N=" << batch << " C=" << channels
    << " H=" << h << " W=" << w << " eps=" << eps << " momentum=" << momentum << " fuse=" << bn_fuse_name(fuse);
  if (half_y) s << " y=" << dtype_name(half);
  if (half_dx) s << " dx=" << dtype_name(half);
  s << ")";
  return s.str();
}

namespace {
// The arguments every forward form shares: y, x, the residual iff add_relu, gamma, beta and
// two per-channel fp32 statistics (running or saved, named as given).
void check_forward(const BatchNormDesc& d, const Tensor& y, const Tensor& x, const Tensor* residual,
                   const Tensor& gamma, const Tensor& beta, const Tensor& stat0, const char* name0, const Tensor& stat1,
                   const char* name1) {
  const auto op = d.str();
  const Shape xs = d.x_shape(), cs = {d.channels};
  check_tensor(y, xs, d.y_dtype(), d.layout, "y", op);
  check_tensor(x, xs, d.dtype, d.layout, "x", op);
  RN_CHECK((residual != nullptr) == (d.fuse == BnFuse::add_relu)) << op << ": residual given iff add_relu";
  if (residual) check_tensor(*residual, xs, d.dtype, d.layout, "residual", op);
  check_tensor(gamma, cs, DType::f32, "gamma", op);
  check_tensor(beta, cs, DType::f32, "beta", op);
  check_tensor(stat0, cs, DType::f32, name0, op);
  check_tensor(stat1, cs, DType::f32, name1, op);
}
}  // namespace

void BatchNormKernel::forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd,
                                       const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                       const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) {
  check_forward(desc_, y, x, residual, gamma, beta, running_mean, "running_mean", running_var, "running_var");
  const auto op = desc_.str();
  const Shape cs = {desc_.channels};
  check_tensor(saved_mean, cs, DType::f32, "saved_mean", op);
  check_tensor(saved_invstd, cs, DType::f32, "saved_invstd", op);
  do_forward_training(y, saved_mean, saved_invstd, x, residual, gamma, beta, running_mean, running_var);
}

void BatchNormKernel::forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual,
                                        const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                        const Tensor& running_var) {
  check_forward(desc_, y, x, residual, gamma, beta, running_mean, "running_mean", running_var, "running_var");
  do_forward_inference(y, x, residual, gamma, beta, running_mean, running_var);
}

void BatchNormKernel::forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                        const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) {
  check_forward(desc_, y, x, residual, gamma, beta, saved_mean, "saved_mean", saved_invstd, "saved_invstd");
  do_forward_recompute(y, x, residual, gamma, beta, saved_mean, saved_invstd);
}

void BatchNormKernel::backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                               const Tensor& saved_mean, const Tensor& saved_invstd) {
  const auto op = desc_.str();
  const Shape xs = desc_.x_shape(), cs = {desc_.channels};
  check_tensor(dx, xs, desc_.dx_dtype(), desc_.layout, "dx", op);
  RN_CHECK((dresidual != nullptr) == (desc_.fuse == BnFuse::add_relu)) << op << ": dresidual given iff add_relu";
  if (dresidual) check_tensor(*dresidual, xs, desc_.dtype, desc_.layout, "dresidual", op);
  check_tensor(dgamma, cs, DType::f32, "dgamma", op);
  check_tensor(dbeta, cs, DType::f32, "dbeta", op);
  check_tensor(dy, xs, desc_.y_dtype(), desc_.layout, "dy", op);
  check_tensor(x, xs, desc_.dtype, desc_.layout, "x", op);
  check_tensor(y, xs, desc_.y_dtype(), desc_.layout, "y", op);
  check_tensor(gamma, cs, DType::f32, "gamma", op);
  check_tensor(saved_mean, cs, DType::f32, "saved_mean", op);
  check_tensor(saved_invstd, cs, DType::f32, "saved_invstd", op);
  do_backward(dx, dresidual, dgamma, dbeta, dy, x, y, gamma, saved_mean, saved_invstd);
}

void BatchNormKernel::set_stats_reducer(BatchStatsReducer* r) {
  do_set_stats_reducer(r);
  reducer_ = r;
}

void BatchNormKernel::do_set_stats_reducer(BatchStatsReducer* r) {
  if (r != nullptr)
    RN_UNSUPPORTED() << desc_.str()
                     << ": this backend has no synchronised batch norm (it cannot sum batch statistics over ranks)";
}

}  // namespace rn

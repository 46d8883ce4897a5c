#include "ops/linear.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

void LinearDesc::validate() const {
  RN_CHECK(batch > 0 && in_features > 0 && out_features > 0) << "linear: empty shape in " << str();
  RN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16)
      << "linear: dtype must be floating in " << str();
}

std::string LinearDesc::str() const {
  std::ostringstream s;
  s << "linear(" << dtype_name(dtype) << " N=" << batch << " in=" << in_features << " out=" << out_features
    << (bias ? " bias" : "") << ")";
  return s.str();
}

void LinearKernel::forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  const auto op = desc_.str();
  check_tensor(y, desc_.y_shape(), desc_.dtype, "y", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, "x", op);
  check_tensor(w, desc_.w_shape(), desc_.dtype, "w", op);
  RN_CHECK((b != nullptr) == desc_.bias) << op << ": bias " << (b ? "given but not declared" : "missing");
  if (b) check_tensor(*b, {desc_.out_features}, DType::f32, "b", op);
  do_forward(y, x, w, b);
}

void LinearKernel::backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const auto op = desc_.str();
  check_tensor(dx, desc_.x_shape(), desc_.dtype, "dx", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, "dy", op);
  check_tensor(w, desc_.w_shape(), desc_.dtype, "w", op);
  do_backward_data(dx, dy, w);
}

void LinearKernel::backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  const auto op = desc_.str();
  check_tensor(dw, desc_.w_shape(), DType::f32, "dw", op);
  RN_CHECK((db != nullptr) == desc_.bias) << op << ": bias gradient " << (db ? "given but no bias" : "missing");
  if (db) check_tensor(*db, {desc_.out_features}, DType::f32, "db", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, "dy", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, "x", op);
  do_backward_weights(dw, db, dy, x);
}

}  // namespace rn

#include "ops/elementwise.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

namespace {
bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

void check_dense(const Tensor& t, int64_t numel, DType dtype, const char* what, const std::string& op) {
  RN_CHECK(t.data != nullptr || numel == 0) << op << ": " << what << " has no data";
  RN_CHECK(t.numel() == numel) << op << ": " << what << " has " << t.numel() << " elements, expected " << numel;
  RN_CHECK(t.dtype == dtype) << op << ": " << what << " has dtype " << dtype_name(t.dtype) << ", expected "
                             << dtype_name(dtype);
}
}  // namespace

void EltwiseDesc::validate() const {
  RN_CHECK(numel >= 0) << "negative element count in " << str();
  RN_CHECK(is_float(dtype)) << "element-wise op needs a floating dtype in " << str();
}

std::string EltwiseDesc::str() const {
  std::ostringstream s;
  s << "eltwise(" << dtype_name(dtype) << " n=" << numel << ")";
  return s.str();
}

void CastDesc::validate() const {
  RN_CHECK(numel >= 0) << "negative element count in " << str();
  RN_CHECK(is_float(src) && is_float(dst)) << "cast needs floating dtypes in " << str();
}

std::string CastDesc::str() const {
  std::ostringstream s;
  s << "cast(" << dtype_name(src) << "->" << dtype_name(dst) << " n=" << numel << ")";
  return s.str();
}

void ReluKernel::forward(const Tensor& y, const Tensor& x) {
  const auto op = "relu " + desc_.str();
  check_dense(y, desc_.numel, desc_.dtype, "y", op);
  check_dense(x, desc_.numel, desc_.dtype, "x", op);
  do_forward(y, x);
}

void ReluKernel::backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  const auto op = "relu " + desc_.str();
  check_dense(dx, desc_.numel, desc_.dtype, "dx", op);
  check_dense(dy, desc_.numel, desc_.dtype, "dy", op);
  check_dense(y, desc_.numel, desc_.dtype, "y", op);
  do_backward(dx, dy, y);
}

void AddKernel::forward(const Tensor& y, const Tensor& a, const Tensor& b) {
  const auto op = "add " + desc_.str();
  check_dense(y, desc_.numel, desc_.dtype, "y", op);
  check_dense(a, desc_.numel, desc_.dtype, "a", op);
  check_dense(b, desc_.numel, desc_.dtype, "b", op);
  RN_CHECK(a.shape.rank() != 4 || a.layout == b.layout) << op << ": a and b differ in layout";
  do_forward(y, a, b);
}

void CastKernel::forward(const Tensor& y, const Tensor& x) {
  const auto op = desc_.str();
  check_dense(y, desc_.numel, desc_.dst, "y", op);
  check_dense(x, desc_.numel, desc_.src, "x", op);
  do_forward(y, x);
}

}  // namespace rn

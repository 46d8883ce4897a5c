#include "ops/pool.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

void MaxPoolDesc::validate() const {
  RN_CHECK(batch > 0 && channels > 0 && in_h > 0 && in_w > 0) << "max_pool: empty input in " << str();
  RN_CHECK(kernel > 0 && stride > 0 && pad >= 0) << "max_pool: bad window in " << str();
  RN_CHECK(2 * pad <= kernel) << "max_pool: padding must be at most half the kernel in " << str();
  RN_CHECK(out_h() > 0 && out_w() > 0) << "max_pool: output would be empty in " << str();
  // Past this every size and offset computation wraps (the output is smaller than the input).
  RN_CHECK(shape_bytes_fit(x_shape(), dtype))
      << "max_pool: the input " << x_shape().str() << " has more bytes than a 64-bit size holds in " << str()
      << ": lower the batch size or the input size";
}

std::string MaxPoolDesc::str() const {
  std::ostringstream s;
  s << "max_pool(" << dtype_name(dtype) << " " << layout_name(layout) << " N=" << batch << " C=" << channels
    << " H=" << in_h << " W=" << in_w << " k=" << kernel << " s=" << stride << " p=" << pad << ")";
  return s.str();
}

void MaxPoolKernel::forward(const Tensor& y, const Tensor& workspace, const Tensor& x) {
  const auto op = desc_.str();
  check_tensor(y, desc_.y_shape(), desc_.dtype, desc_.layout, "y", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, desc_.layout, "x", op);
  RN_CHECK(workspace.bytes() >= workspace_bytes()) << op << ": workspace of " << workspace.bytes()
                                                   << " bytes, needs " << workspace_bytes();
  do_forward(y, workspace, x);
}

void MaxPoolKernel::backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace) {
  const auto op = desc_.str();
  check_tensor(dx, desc_.x_shape(), desc_.dtype, desc_.layout, "dx", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, desc_.layout, "dy", op);
  RN_CHECK(workspace.bytes() >= workspace_bytes()) << op << ": workspace of " << workspace.bytes()
                                                   << " bytes, needs " << workspace_bytes();
  do_backward(dx, dy, workspace);
}

void GlobalAvgPoolDesc::validate() const {
  RN_CHECK(batch > 0 && channels > 0 && h > 0 && w > 0) << "global_avg_pool: empty input in " << str();
  RN_CHECK(shape_bytes_fit(x_shape(), dtype))
      << "global_avg_pool: the input " << x_shape().str() << " has more bytes than a 64-bit size holds in " << str()
      << ": lower the batch size or the input size";
}

std::string GlobalAvgPoolDesc::str() const {
  std::ostringstream s;
  s << "global_avg_pool(" << dtype_name(dtype) << " " << layout_name(layout) << " N=" << batch << " C=" << channels
    << " H=" << h << " W=" << w << ")";
  return s.str();
}

void GlobalAvgPoolKernel::forward(const Tensor& y, const Tensor& x) {
  const auto op = desc_.str();
  check_tensor(y, desc_.y_shape(), desc_.dtype, "y", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, desc_.layout, "x", op);
  do_forward(y, x);
}

void GlobalAvgPoolKernel::backward(const Tensor& dx, const Tensor& dy) {
  const auto op = desc_.str();
  check_tensor(dx, desc_.x_shape(), desc_.dtype, desc_.layout, "dx", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, "dy", op);
  do_backward(dx, dy);
}

}  // namespace rn

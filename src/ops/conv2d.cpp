#include "ops/conv2d.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

int64_t Conv2dDesc::macs() const {
  return batch * p.out_channels * out_h() * out_w() * (p.in_channels / p.groups) * p.kernel_h * p.kernel_w;
}

void Conv2dDesc::validate() const {
  RN_CHECK(p.in_channels > 0 && p.out_channels > 0) << "conv2d: channels must be positive in " << str();
  RN_CHECK(p.groups > 0 && p.in_channels % p.groups == 0 && p.out_channels % p.groups == 0)
      << "conv2d: groups must divide in and out channels in " << str();
  RN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 &&
           p.dilation_w > 0)
      << "conv2d: kernel, stride and dilation must be positive in " << str();
  RN_CHECK(p.pad_h >= 0 && p.pad_w >= 0) << "conv2d: padding must be non-negative in " << str();
  RN_CHECK(batch > 0 && in_h > 0 && in_w > 0) << "conv2d: input must be non-empty in " << str();
  RN_CHECK(out_h() > 0 && out_w() > 0) << "conv2d: output would be empty in " << str();
  RN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16)
      << "conv2d: dtype must be floating in " << str();
  RN_CHECK(!(f32_y || f32_dx) || dtype != DType::f32)
      << "conv2d: fp32 outputs are for a half-precision convolution, not an fp32 one, in " << str();
  // Past this every size and offset computation (ours and the library's) wraps.
  RN_CHECK(shape_bytes_fit(x_shape(), DType::f32) && shape_bytes_fit(y_shape(), DType::f32))  // at most 4 bytes each
      << "conv2d: the input " << x_shape().str() << " or output " << y_shape().str()
      << " has more bytes than a 64-bit size holds in " << str() << ": lower the batch size or the input size";
  int64_t m = 0;
  RN_CHECK(!__builtin_mul_overflow(batch * p.out_channels * out_h() * out_w(),
                                   (p.in_channels / p.groups) * p.kernel_h * p.kernel_w, &m))
      << "conv2d: the multiply-add count does not fit in 64 bits in " << str()
      << ": lower the batch size or the input size";
}

std::string Conv2dDesc::str() const {
  std::ostringstream s;
  s << "conv2d(" << dtype_name(dtype) << " " << layout_name(layout) << " N=" << batch << " C=" << p.in_channels
    << " H=" << in_h << " W=" << in_w << " K=" << p.out_channels << " R=" << p.kernel_h << " S=" << p.kernel_w
    << " stride=" << p.stride_h << "x" << p.stride_w << " pad=" << p.pad_h << "x" << p.pad_w << " dil=" << p.dilation_h
    << "x" << p.dilation_w << " groups=" << p.groups << (p.bias ? " bias" : "") << (f32_y ? " f32-y" : "")
    << (f32_dx ? " f32-dx" : "") << ")";
  return s.str();
}

void Conv2dKernel::forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  const auto op = desc_.str();
  check_tensor(y, desc_.y_shape(), desc_.y_dtype(), desc_.layout, "y", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, desc_.layout, "x", op);
  check_tensor(w, desc_.w_shape(), desc_.dtype, "w", op);
  RN_CHECK((b != nullptr) == desc_.p.bias) << op << ": bias " << (b ? "given but not declared" : "missing");
  if (b) check_tensor(*b, {desc_.p.out_channels}, DType::f32, "b", op);
  do_forward(y, x, w, b);
}

void Conv2dKernel::backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const auto op = desc_.str();
  check_tensor(dx, desc_.x_shape(), desc_.dx_dtype(), desc_.layout, "dx", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, desc_.layout, "dy", op);
  check_tensor(w, desc_.w_shape(), desc_.dtype, "w", op);
  do_backward_data(dx, dy, w);
}

void Conv2dKernel::backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  const auto op = desc_.str();
  check_tensor(dw, desc_.w_shape(), DType::f32, "dw", op);
  RN_CHECK((db != nullptr) == desc_.p.bias) << op << ": bias gradient " << (db ? "given but no bias" : "missing");
  if (db) check_tensor(*db, {desc_.p.out_channels}, DType::f32, "db", op);
  check_tensor(dy, desc_.y_shape(), desc_.dtype, desc_.layout, "dy", op);
  check_tensor(x, desc_.x_shape(), desc_.dtype, desc_.layout, "x", op);
  do_backward_weights(dw, db, dy, x);
}

}  // namespace rn

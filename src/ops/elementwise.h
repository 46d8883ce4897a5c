// Element-wise ops over dense storage (any rank; both operands share shape, dtype and
// layout). Outputs may alias their first input.
//   relu:  y = max(x, 0);         backward: dx = dy * (y > 0)  (dx overwritten)
//   add:   y = a + b;             backward is the identity on both inputs (the graph
//                                 executor routes dy; no kernel needed)
//   cast:  y = convert(x) between fp32, bf16 and fp16, rounding to nearest even
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

struct EltwiseDesc {
  int64_t numel = 0;
  DType dtype = DType::f32;
  void validate() const;
  std::string str() const;
};

class ReluKernel {
 public:
  explicit ReluKernel(const EltwiseDesc& d) : desc_(d) {}
  virtual ~ReluKernel() = default;
  const EltwiseDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& x);
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& y);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x) = 0;
  virtual void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) = 0;
  EltwiseDesc desc_;
};

class AddKernel {
 public:
  explicit AddKernel(const EltwiseDesc& d) : desc_(d) {}
  virtual ~AddKernel() = default;
  const EltwiseDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& a, const Tensor& b);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& a, const Tensor& b) = 0;
  EltwiseDesc desc_;
};

struct CastDesc {
  int64_t numel = 0;
  DType src = DType::f32, dst = DType::bf16;
  void validate() const;
  std::string str() const;
};

class CastKernel {
 public:
  explicit CastKernel(const CastDesc& d) : desc_(d) {}
  virtual ~CastKernel() = default;
  const CastDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& x);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x) = 0;
  CastDesc desc_;
};

}  // namespace rn

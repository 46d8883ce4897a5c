// linear: y[N,O] = x[N,I] * w[O,I]^T + b[O]   (PyTorch's layout for w)
// x, y, w, dx, dy have the activation dtype; b, dw, db are fp32. dx is overwritten;
// dw, db accumulate.
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

struct LinearDesc {
  int64_t batch = 1, in_features = 1, out_features = 1;
  bool bias = true;
  DType dtype = DType::f32;
  Shape x_shape() const { return {batch, in_features}; }
  Shape y_shape() const { return {batch, out_features}; }
  Shape w_shape() const { return {out_features, in_features}; }
  void validate() const;
  std::string str() const;
};

class LinearKernel {
 public:
  explicit LinearKernel(const LinearDesc& d) : desc_(d) {}
  virtual ~LinearKernel() = default;
  const LinearDesc& desc() const { return desc_; }
  void forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b);
  void backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w);
  void backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x);

 protected:
  virtual void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) = 0;
  virtual void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) = 0;
  virtual void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) = 0;
  LinearDesc desc_;
};

}  // namespace rn

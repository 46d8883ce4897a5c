// softmax_cross_entropy with label smoothing eps over K classes, mean over the batch:
//   p = softmax(logits); t = (1-eps)*onehot(label) + eps/K
//   loss = -(1/N) sum_n sum_k t[n,k] * log p[n,k]
// backward: dlogits = grad_scale * (p - t) / N   (overwritten; grad_scale carries the
// upstream gradient and the loss scale). All tensors fp32; labels int32 in [0, K).
// A label outside [0, K) is an error naming the sample.
#pragma once

#include <string>

#include "core/tensor.h"

namespace rn {

struct SoftmaxCrossEntropyDesc {
  int64_t batch = 1, classes = 1;
  float label_smoothing = 0.0f;
  void validate() const;
  std::string str() const;
};

class SoftmaxCrossEntropyKernel {
 public:
  explicit SoftmaxCrossEntropyKernel(const SoftmaxCrossEntropyDesc& d) : desc_(d) {}
  virtual ~SoftmaxCrossEntropyKernel() = default;
  const SoftmaxCrossEntropyDesc& desc() const { return desc_; }
  // loss: fp32 [1]; probs: fp32 [N,K] saved for backward.
  void forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels);
  void backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale);
  // An fp32 [1] tensor whose value multiplies grad_scale in every backward: the loss scale
  // kept in device memory by a fused device step, so that no host round trip is needed.
  // A host tensor is read by the public backward; a device one by the backend's kernel.
  // nullptr removes it.
  void set_scale_source(const Tensor* source);

 protected:
  const Tensor* scale_source() const { return has_scale_source_ ? &scale_source_ : nullptr; }
  Tensor scale_source_;
  bool has_scale_source_ = false;
  virtual void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) = 0;
  virtual void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) = 0;
  SoftmaxCrossEntropyDesc desc_;
};

}  // namespace rn

#include "ops/loss.h"

#include <sstream>

#include "ops/check_tensor.h"

namespace rn {

void SoftmaxCrossEntropyDesc::validate() const {
  RN_CHECK(batch > 0 && classes > 1) << "softmax_cross_entropy: needs a batch and at least 2 classes in " << str();
  RN_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f)
      << "softmax_cross_entropy: label_smoothing must be in [0, 1) in " << str();
}

std::string SoftmaxCrossEntropyDesc::str() const {
  std::ostringstream s;
  s << "softmax_cross_entropy(N=" << batch << " K=" << classes << " smoothing=" << label_smoothing << ")";
  return s.str();
}

namespace {
void check_labels(const Tensor& labels, const SoftmaxCrossEntropyDesc& d, const std::string& op) {
  check_tensor(labels, {d.batch}, DType::i32, "labels", op);
  if (labels.device != Device::cpu) return;  // device backends check on the device
  const int32_t* l = labels.ptr<int32_t>();
  for (int64_t n = 0; n < d.batch; ++n)
    RN_CHECK(l[n] >= 0 && l[n] < d.classes) << op << ": label " << l[n] << " of sample " << n << " is outside [0, "
                                            << d.classes << ")";
}
}  // namespace

void SoftmaxCrossEntropyKernel::forward(const Tensor& loss, const Tensor& probs, const Tensor& logits,
                                        const Tensor& labels) {
  const auto op = desc_.str();
  const Shape nk = {desc_.batch, desc_.classes};
  check_tensor(loss, {1}, DType::f32, "loss", op);
  check_tensor(probs, nk, DType::f32, "probs", op);
  check_tensor(logits, nk, DType::f32, "logits", op);
  check_labels(labels, desc_, op);
  do_forward(loss, probs, logits, labels);
}

void SoftmaxCrossEntropyKernel::backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels,
                                         float grad_scale) {
  const auto op = desc_.str();
  const Shape nk = {desc_.batch, desc_.classes};
  check_tensor(dlogits, nk, DType::f32, "dlogits", op);
  check_tensor(probs, nk, DType::f32, "probs", op);
  check_labels(labels, desc_, op);
  if (has_scale_source_ && scale_source_.device == Device::cpu) {
    // A host scale: folded in here, so host backends need not know about it.
    const Tensor keep = scale_source_;
    has_scale_source_ = false;
    do_backward(dlogits, probs, labels, grad_scale * *keep.ptr<float>());
    has_scale_source_ = true;
    return;
  }
  do_backward(dlogits, probs, labels, grad_scale);
}

void SoftmaxCrossEntropyKernel::set_scale_source(const Tensor* source) {
  if (source == nullptr) {
    has_scale_source_ = false;
    return;
  }
  check_tensor(*source, {1}, DType::f32, "scale source", desc_.str());
  scale_source_ = *source;
  has_scale_source_ = true;
}

}  // namespace rn

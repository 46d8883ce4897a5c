// softmax cross-entropy with label smoothing: a plain loop in fp32 with a double-precision
// batch sum ([N, K] is tiny next to any convolution, so oneDNN buys nothing here).
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_common.h"

namespace rn::cpu {
namespace {

class CpuSoftmaxCrossEntropy final : public SoftmaxCrossEntropyKernel {
 public:
  explicit CpuSoftmaxCrossEntropy(const SoftmaxCrossEntropyDesc& d) : SoftmaxCrossEntropyKernel(d) {}

 protected:
  // p = softmax(z); loss_n = -sum_k t_k log p_k with log p_k = z_k - max - log(sum exp(z - max)).
  void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) override {
    const int64_t N = desc_.batch, K = desc_.classes;
    const float eps = desc_.label_smoothing;
    const float off = eps / static_cast<float>(K), on = 1.0f - eps + off;
    const int32_t* label = labels.ptr<int32_t>();
    double total = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* z = logits.ptr<float>() + n * K;
      float* p = probs.ptr<float>() + n * K;
      float zmax = z[0];
      for (int64_t k = 1; k < K; ++k) zmax = std::max(zmax, z[k]);
      double sum = 0.0, zsum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        p[k] = std::exp(z[k] - zmax);
        sum += p[k];
        zsum += z[k];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t k = 0; k < K; ++k) p[k] *= inv;
      // sum_k t_k log p_k = off * sum_k log p_k + (on - off) * log p_label
      const double log_sum = std::log(sum);
      const double sum_log_p = zsum - static_cast<double>(K) * (zmax + log_sum);
      const double log_p_label = z[label[n]] - zmax - log_sum;
      total -= off * sum_log_p + (on - off) * log_p_label;
    }
    *loss.ptr<float>() = static_cast<float>(total / static_cast<double>(N));
  }

  void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) override {
    const int64_t N = desc_.batch, K = desc_.classes;
    const float eps = desc_.label_smoothing;
    const float off = eps / static_cast<float>(K), on = 1.0f - eps + off;
    const float scale = grad_scale / static_cast<float>(N);
    const int32_t* label = labels.ptr<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const float* p = probs.ptr<float>() + n * K;
      float* g = dlogits.ptr<float>() + n * K;
      for (int64_t k = 0; k < K; ++k) g[k] = scale * (p[k] - (k == label[n] ? on : off));
    }
  }
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const ContextPtr& /*ctx*/,
                                                                      const SoftmaxCrossEntropyDesc& d) {
  d.validate();
  return std::make_unique<CpuSoftmaxCrossEntropy>(d);
}

}  // namespace rn::cpu

// Reference softmax cross-entropy with label smoothing, in fp64 per sample:
//   lse = max + log sum_k exp(l_k - max);  p_k = exp(l_k - lse)
//   t_k = (1 - eps) [k == label] + eps / K;  loss_n = lse - sum_k t_k l_k  (sum_k t_k = 1)
//   loss = mean_n loss_n;  dlogits = grad_scale (p - t) / N  (overwritten)
// The public methods have already checked every label against [0, K).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

class RefSoftmaxCrossEntropy final : public SoftmaxCrossEntropyKernel {
 public:
  using SoftmaxCrossEntropyKernel::SoftmaxCrossEntropyKernel;

 protected:
  void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) override {
    const int64_t N = desc_.batch, K = desc_.classes;
    const double eps = desc_.label_smoothing;
    const float* lp = logits.ptr<float>();
    const int32_t* label = labels.ptr<int32_t>();
    float* pp = probs.ptr<float>();
    std::vector<double> per_sample(static_cast<size_t>(N));
    ThreadPool::global().parallel_for(N, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const float* l = lp + n * K;
        const double mx = *std::max_element(l, l + K);
        double sum_exp = 0.0, sum_l = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          sum_exp += std::exp(l[k] - mx);
          sum_l += l[k];
        }
        const double lse = mx + std::log(sum_exp);
        for (int64_t k = 0; k < K; ++k) pp[n * K + k] = static_cast<float>(std::exp(l[k] - lse));
        const double t_l = (1.0 - eps) * l[label[n]] + eps / static_cast<double>(K) * sum_l;
        per_sample[static_cast<size_t>(n)] = lse - t_l;
      }
    });
    double total = 0.0;
    for (double v : per_sample) total += v;
    loss.ptr<float>()[0] = static_cast<float>(total / static_cast<double>(N));
  }

  void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) override {
    const int64_t N = desc_.batch, K = desc_.classes;
    const double eps = desc_.label_smoothing, off = eps / static_cast<double>(K);
    const double scale = static_cast<double>(grad_scale) / static_cast<double>(N);
    const float* pp = probs.ptr<float>();
    const int32_t* label = labels.ptr<int32_t>();
    float* dp = dlogits.ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const double t = off + (k == label[n] ? 1.0 - eps : 0.0);
        dp[n * K + k] = static_cast<float>(scale * (pp[n * K + k] - t));
      }
    }
  }
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) {
  d.validate();
  return std::make_unique<RefSoftmaxCrossEntropy>(d);
}

}  // namespace rn::ref

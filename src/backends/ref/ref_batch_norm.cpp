// Reference batch norm, one channel per task, statistics and gradient sums in fp64.
//
// Training forward (M = N * H * W values per channel):
//   mean = sum x / M;  var = sum (x - mean)^2 / M  (two passes);  invstd = 1 / sqrt(var + eps)
//   z = gamma * (x - mean) * invstd + beta  [+ residual];  y = z or max(0, z)
//   running_mean = (1 - m) running_mean + m mean;  running_var = (1 - m) running_var + m var M / (M - 1)
// Backward, with g = dy * (y > 0) when fused with a ReLU (else g = dy), xhat = (x - mean) invstd:
//   dbeta += sum g;  dgamma += sum g xhat;  dresidual = g
//   dx = gamma invstd (g - sum g / M - xhat sum(g xhat) / M)
// Every pass reads an element before writing it, so outputs may alias inputs element-wise.
#include <atomic>
#include <bit>
#include <cmath>

#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

class RefBatchNorm final : public BatchNormKernel {
 public:
  explicit RefBatchNorm(const BatchNormDesc& d) : BatchNormKernel(d) {
    const Strides4 s = strides4(d.channels, d.h, d.w, d.layout);
    sn_ = s.n, sc_ = s.c, shw_ = s.w;  // h * W + w steps by the w stride in both layouts
    hw_ = d.h * d.w;
    m_ = d.batch * hw_;
  }

 protected:
  void do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                           const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var) override {
    RN_CHECK(m_ > 1) << desc_.str() << ": training needs more than one value per channel (N*H*W = " << m_ << ")";
    const float* xp = x.ptr<float>();
    const float* rp = residual ? residual->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    const double momentum = desc_.momentum;
    ThreadPool::global().parallel_for(desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double mean, var, invstd;
        batch_stats(xp, c, &mean, &var, &invstd);
        normalize(yp, xp, rp, c, mean, invstd, gamma.ptr<float>()[c], beta.ptr<float>()[c]);
        saved_mean.ptr<float>()[c] = static_cast<float>(mean);
        saved_invstd.ptr<float>()[c] = static_cast<float>(invstd);
        float& rm = running_mean.ptr<float>()[c];
        float& rv = running_var.ptr<float>()[c];
        const double unbiased = var * static_cast<double>(m_) / static_cast<double>(m_ - 1);
        rm = static_cast<float>((1.0 - momentum) * rm + momentum * mean);
        rv = static_cast<float>((1.0 - momentum) * rv + momentum * unbiased);
      }
    });
  }

  // The same statistics and normalisation as training, in the same order, so y is the
  // same bits; running statistics are left alone.
  void do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) override {
    const float* xp = x.ptr<float>();
    const float* rp = residual ? residual->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    std::atomic<int64_t> mismatch{-1};
    ThreadPool::global().parallel_for(desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double mean, var, invstd;
        batch_stats(xp, c, &mean, &var, &invstd);
        // Bits, not ==: a NaN statistic (an overflowing step that will be skipped) recomputes too.
        if (std::bit_cast<uint32_t>(static_cast<float>(mean)) != std::bit_cast<uint32_t>(saved_mean.ptr<float>()[c]) ||
            std::bit_cast<uint32_t>(static_cast<float>(invstd)) !=
                std::bit_cast<uint32_t>(saved_invstd.ptr<float>()[c]))
          mismatch = c;
        normalize(yp, xp, rp, c, mean, invstd, gamma.ptr<float>()[c], beta.ptr<float>()[c]);
      }
    });
    RN_CHECK(mismatch < 0) << desc_.str() << ": recomputed batch statistics of channel " << mismatch.load()
                           << " differ from the saved ones (the input changed since forward_training)";
  }

  void do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) override {
    const float* xp = x.ptr<float>();
    const float* rp = residual ? residual->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    ThreadPool::global().parallel_for(desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var.ptr<float>()[c]) + desc_.eps);
        normalize(yp, xp, rp, c, running_mean.ptr<float>()[c], invstd, gamma.ptr<float>()[c], beta.ptr<float>()[c]);
      }
    });
  }

  void do_backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                   const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                   const Tensor& saved_invstd) override {
    const float* xp = x.ptr<float>();
    const float* yp = y.ptr<float>();
    const float* dyp = dy.ptr<float>();
    float* dxp = dx.ptr<float>();
    float* drp = dresidual ? dresidual->ptr<float>() : nullptr;
    const bool masked = desc_.fuse != BnFuse::none;
    const double inv_m = 1.0 / static_cast<double>(m_);
    ThreadPool::global().parallel_for(desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mean = saved_mean.ptr<float>()[c], invstd = saved_invstd.ptr<float>()[c];
        double sum_g = 0.0, sum_g_xhat = 0.0;
        for_each(c, [&](int64_t i) {
          const double g = masked && !(yp[i] > 0.0f) ? 0.0 : static_cast<double>(dyp[i]);
          sum_g += g;
          sum_g_xhat += g * (xp[i] - mean) * invstd;
        });
        dbeta.ptr<float>()[c] = static_cast<float>(dbeta.ptr<float>()[c] + sum_g);
        dgamma.ptr<float>()[c] = static_cast<float>(dgamma.ptr<float>()[c] + sum_g_xhat);
        const double scale = gamma.ptr<float>()[c] * invstd;
        const double mean_g = sum_g * inv_m, mean_g_xhat = sum_g_xhat * inv_m;
        for_each(c, [&](int64_t i) {
          const double g = masked && !(yp[i] > 0.0f) ? 0.0 : static_cast<double>(dyp[i]);
          const double xhat = (xp[i] - mean) * invstd;
          dxp[i] = static_cast<float>(scale * (g - mean_g - xhat * mean_g_xhat));
          if (drp) drp[i] = static_cast<float>(g);
        });
      }
    });
  }

 private:
  // Two-pass batch mean and biased variance of channel c, and 1 / sqrt(var + eps).
  void batch_stats(const float* xp, int64_t c, double* mean, double* var, double* invstd) const {
    double sum = 0.0;
    for_each(c, [&](int64_t i) { sum += xp[i]; });
    *mean = sum / static_cast<double>(m_);
    double sq = 0.0;
    for_each(c, [&](int64_t i) {
      const double d = xp[i] - *mean;
      sq += d * d;
    });
    *var = sq / static_cast<double>(m_);
    *invstd = 1.0 / std::sqrt(*var + desc_.eps);
  }

  // Calls fn(element offset) for every element of channel c, in a fixed order.
  template <typename Fn>
  void for_each(int64_t c, Fn&& fn) const {
    for (int64_t n = 0; n < desc_.batch; ++n) {
      const int64_t base = n * sn_ + c * sc_;
      for (int64_t i = 0; i < hw_; ++i) fn(base + i * shw_);
    }
  }

  // y = [relu](gamma * (x - mean) * invstd + beta [+ residual]) over channel c.
  void normalize(float* y, const float* x, const float* residual, int64_t c, double mean, double invstd, double gamma,
                 double beta) const {
    const double scale = gamma * invstd;
    const bool relu = desc_.fuse != BnFuse::none;
    for_each(c, [&](int64_t i) {
      double z = (x[i] - mean) * scale + beta;
      if (residual) z += residual[i];
      y[i] = static_cast<float>(relu && z < 0.0 ? 0.0 : z);  // NaN propagates
    });
  }

  int64_t sn_, sc_, shw_, hw_, m_;
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  return std::make_unique<RefBatchNorm>(d);
}

}  // namespace rn::ref

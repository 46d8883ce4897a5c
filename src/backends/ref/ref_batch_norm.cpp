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
//
// Synchronised (a stats reducer set): the forward sums S = sum x and Q = sum x^2 per channel
// (fp64, one pass), reduces [S, Q, M] over the ranks, and uses mean = S / M and
// var = Q / M - mean^2 of all ranks. y is normalised with the fp32-rounded mean and invstd,
// exactly the saved values, so that forward_recompute (which has only those and must not
// communicate) writes the same bits. The backward reduces [sum g, sum g xhat, M] and keeps
// dgamma and dbeta local.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <vector>

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
  // Synchronised statistics are supported; forget what an earlier forward recorded.
  void do_set_stats_reducer(BatchStatsReducer*) override { forward_sums_.clear(); }

  void do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                           const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var) override {
    if (stats_reducer() != nullptr) {
      forward_training_synced(y, saved_mean, saved_invstd, x, residual, gamma, beta, running_mean, running_var);
      return;
    }
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
    if (stats_reducer() != nullptr) {
      forward_recompute_synced(y, x, residual, gamma, beta, saved_mean, saved_invstd);
      return;
    }
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
    const GradArgs a{dx.ptr<float>(), dresidual ? dresidual->ptr<float>() : nullptr, dy.ptr<float>(), x.ptr<float>(),
                     y.ptr<float>()};
    BatchStatsReducer* reducer = stats_reducer();
    const int64_t C = desc_.channels;
    // Local sums per channel: [sum g (C), sum g xhat (C), M]; dgamma and dbeta take the local ones.
    sync_.assign(static_cast<size_t>(2 * C + 1), 0.0);
    ThreadPool::global().parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sum_g, sum_g_xhat;
        grad_sums(a, c, saved_mean.ptr<float>()[c], saved_invstd.ptr<float>()[c], &sum_g, &sum_g_xhat);
        dbeta.ptr<float>()[c] = static_cast<float>(dbeta.ptr<float>()[c] + sum_g);
        dgamma.ptr<float>()[c] = static_cast<float>(dgamma.ptr<float>()[c] + sum_g_xhat);
        sync_[static_cast<size_t>(c)] = sum_g;
        sync_[static_cast<size_t>(C + c)] = sum_g_xhat;
      }
    });
    sync_[static_cast<size_t>(2 * C)] = static_cast<double>(m_);
    if (reducer != nullptr) reducer->sum(sync_.data(), 2 * C + 1);
    const double inv_m = 1.0 / sync_[static_cast<size_t>(2 * C)];
    ThreadPool::global().parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mean_g = sync_[static_cast<size_t>(c)] * inv_m;
        const double mean_g_xhat = sync_[static_cast<size_t>(C + c)] * inv_m;
        grad_input(a, c, saved_mean.ptr<float>()[c], saved_invstd.ptr<float>()[c], gamma.ptr<float>()[c], mean_g,
                   mean_g_xhat);
      }
    });
  }

 private:
  // Synchronised training forward (see the top of the file).
  void forward_training_synced(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                               const Tensor* residual, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var) {
    const int64_t C = desc_.channels;
    const float* xp = x.ptr<float>();
    sync_.assign(static_cast<size_t>(2 * C + 1), 0.0);
    ThreadPool::global().parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        local_sums(xp, c, &sync_[static_cast<size_t>(c)], &sync_[static_cast<size_t>(C + c)]);
    });
    sync_[static_cast<size_t>(2 * C)] = static_cast<double>(m_);
    forward_sums_.assign(sync_.begin(), sync_.end() - 1);  // for forward_recompute's check
    stats_reducer()->sum(sync_.data(), 2 * C + 1);
    const double m = sync_[static_cast<size_t>(2 * C)];
    // Every rank sees the same global count, so all of them throw here, or none.
    RN_CHECK(m > 1.0) << desc_.str() << ": synchronised training needs more than one value per channel over all "
                      << "ranks (N*H*W summed = " << m << ")";
    const float* rp = residual ? residual->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    const double momentum = desc_.momentum;
    ThreadPool::global().parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mean = sync_[static_cast<size_t>(c)] / m;
        const double var = std::max(sync_[static_cast<size_t>(C + c)] / m - mean * mean, 0.0);
        const float mean32 = static_cast<float>(mean);
        const float invstd32 = static_cast<float>(1.0 / std::sqrt(var + desc_.eps));
        saved_mean.ptr<float>()[c] = mean32;
        saved_invstd.ptr<float>()[c] = invstd32;
        normalize(yp, xp, rp, c, mean32, invstd32, gamma.ptr<float>()[c], beta.ptr<float>()[c]);
        float& rm = running_mean.ptr<float>()[c];
        float& rv = running_var.ptr<float>()[c];
        rm = static_cast<float>((1.0 - momentum) * rm + momentum * mean);
        rv = static_cast<float>((1.0 - momentum) * rv + momentum * var * m / (m - 1.0));
      }
    });
    forward_saved_.resize(static_cast<size_t>(2 * C));
    std::copy_n(saved_mean.ptr<float>(), C, forward_saved_.begin());
    std::copy_n(saved_invstd.ptr<float>(), C, forward_saved_.begin() + C);
  }

  // The synchronised forward's y from the saved global statistics, without communicating.
  // The check that replaces "recomputed statistics equal the saved ones": this rank's local
  // sums and the saved statistics are those of the last synchronised forward_training.
  void forward_recompute_synced(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) {
    const int64_t C = desc_.channels;
    RN_CHECK(static_cast<int64_t>(forward_sums_.size()) == 2 * C)
        << desc_.str() << ": forward_recompute with a stats reducer needs a synchronised forward_training first";
    const float* xp = x.ptr<float>();
    const float* rp = residual ? residual->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    std::atomic<int64_t> mismatch{-1};
    ThreadPool::global().parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sum, sq;
        local_sums(xp, c, &sum, &sq);
        const float mean = saved_mean.ptr<float>()[c], invstd = saved_invstd.ptr<float>()[c];
        if (std::bit_cast<uint64_t>(sum) != std::bit_cast<uint64_t>(forward_sums_[static_cast<size_t>(c)]) ||
            std::bit_cast<uint64_t>(sq) != std::bit_cast<uint64_t>(forward_sums_[static_cast<size_t>(C + c)]) ||
            std::bit_cast<uint32_t>(mean) != std::bit_cast<uint32_t>(forward_saved_[static_cast<size_t>(c)]) ||
            std::bit_cast<uint32_t>(invstd) != std::bit_cast<uint32_t>(forward_saved_[static_cast<size_t>(C + c)]))
          mismatch = c;
        normalize(yp, xp, rp, c, mean, invstd, gamma.ptr<float>()[c], beta.ptr<float>()[c]);
      }
    });
    RN_CHECK(mismatch < 0) << desc_.str() << ": channel " << mismatch.load()
                           << ": the input or the saved statistics differ from those of the last synchronised "
                              "forward_training";
  }

  // sum x and sum x^2 of channel c in fp64, in for_each's order.
  void local_sums(const float* xp, int64_t c, double* sum, double* sq) const {
    double s = 0.0, q = 0.0;
    for_each(c, [&](int64_t i) {
      const double v = xp[i];
      s += v;
      q += v * v;
    });
    *sum = s, *sq = q;
  }

  struct GradArgs {
    float* dx;
    float* dresidual;  // null unless add_relu
    const float *dy, *x, *y;
  };
  double masked_grad(const GradArgs& a, int64_t i) const {
    return desc_.fuse != BnFuse::none && !(a.y[i] > 0.0f) ? 0.0 : static_cast<double>(a.dy[i]);
  }
  // sum g and sum g xhat of channel c.
  void grad_sums(const GradArgs& a, int64_t c, double mean, double invstd, double* sum_g, double* sum_g_xhat) const {
    double sg = 0.0, sgx = 0.0;
    for_each(c, [&](int64_t i) {
      const double g = masked_grad(a, i);
      sg += g;
      sgx += g * (a.x[i] - mean) * invstd;
    });
    *sum_g = sg, *sum_g_xhat = sgx;
  }
  // dx = gamma invstd (g - mean g - xhat mean(g xhat)) and dresidual = g over channel c.
  void grad_input(const GradArgs& a, int64_t c, double mean, double invstd, double gamma, double mean_g,
                  double mean_g_xhat) const {
    const double scale = gamma * invstd;
    for_each(c, [&](int64_t i) {
      const double g = masked_grad(a, i);
      const double xhat = (a.x[i] - mean) * invstd;
      a.dx[i] = static_cast<float>(scale * (g - mean_g - xhat * mean_g_xhat));
      if (a.dresidual) a.dresidual[i] = static_cast<float>(g);
    });
  }

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
  std::vector<double> sync_;          // the vector handed to the reducer
  std::vector<double> forward_sums_;  // synchronised forward: local [sum x, sum x^2] per channel
  std::vector<float> forward_saved_;  // and the [mean, invstd] it saved
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  if (d.mixed()) RN_UNSUPPORTED() << d.str() << ": the reference backend computes fp32 only, y and dx included";
  return std::make_unique<RefBatchNorm>(d);
}

}  // namespace rn::ref

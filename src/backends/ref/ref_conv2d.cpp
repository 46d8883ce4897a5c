// Reference conv2d: im2col + a plain blocked matrix product with fp64 accumulators.
//
// Per image n and group g the column matrix is col[j][pq], j = (c, r, s) within the group
// (J = C/G * R * S rows), pq = p * Q + q (P * Q columns), so that with w[K, C/G, R, S]
// read as a row-major [K, J] matrix:
//   forward:          y[k][pq]   = sum_j  w[k][j]  * col[j][pq] + b[k]
//   backward data:    dcol[j][pq] = sum_k w[k][j]  * dy[k][pq];   dx = col2im(dcol)
//   backward weights: dw[k][j]  += sum_{n,pq} dy[k][pq] * col[j][pq];  db[k] += sum dy[k]
// Products of two floats are exact in double, so the only rounding is the final store.
// dx is overwritten; dw and db accumulate. The summation order depends only on the shape,
// never on the thread count, so results are bit-reproducible.
#include <algorithm>
#include <vector>

#include "backends/ref/ref_blas.h"
#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

// The half-open range [lo, hi) of output indices o in [0, out) whose input index
// o * stride + off lies in [0, in).
void valid_range(int64_t out, int64_t stride, int64_t off, int64_t in, int64_t* lo, int64_t* hi) {
  *lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  *hi = in - 1 - off < 0 ? 0 : (in - 1 - off) / stride + 1;
  *lo = std::min(*lo, out);
  *hi = std::clamp(*hi, *lo, out);
}

class RefConv2d final : public Conv2dKernel {
 public:
  explicit RefConv2d(const Conv2dDesc& d) : Conv2dKernel(d) {
    const auto& p = d.p;
    N_ = d.batch, C_ = p.in_channels, H_ = d.in_h, W_ = d.in_w;
    K_ = p.out_channels, P_ = d.out_h(), Q_ = d.out_w(), R_ = p.kernel_h, S_ = p.kernel_w;
    G_ = p.groups, Cg_ = C_ / G_, Kg_ = K_ / G_, J_ = Cg_ * R_ * S_, PQ_ = P_ * Q_;
    xs_ = strides4(C_, H_, W_, d.layout);
    ys_ = strides4(K_, P_, Q_, d.layout);
    // A 1x1, stride-1, unpadded NCHW conv reads its columns straight from x.
    direct_ = R_ == 1 && S_ == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0 &&
              d.layout == Layout::nchw;
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override {
    const float* xp = x.ptr<float>();
    const float* wp = w.ptr<float>();
    const float* bp = b ? b->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    std::vector<float> col_buf;
    const int64_t n_kb = ceil_div(Kg_, kRows), n_tiles = ceil_div(PQ_, kTile);
    for (int64_t n = 0; n < N_; ++n) {
      const float* col = columns(col_buf, xp, n);
      ThreadPool::global().parallel_for(G_ * n_kb * n_tiles, [&](int64_t begin, int64_t end) {
        double acc[kRows * kTile];
        for (int64_t task = begin; task < end; ++task) {
          const int64_t g = task / (n_kb * n_tiles), kb = task / n_tiles % n_kb, tile = task % n_tiles;
          const int64_t k0 = g * Kg_ + kb * kRows, rows = std::min(kRows, Kg_ - kb * kRows);
          const int64_t t0 = tile * kTile, cols = std::min(kTile, PQ_ - t0);
          for (int64_t i = 0; i < rows; ++i) std::fill_n(acc + i * kTile, cols, bp ? double{bp[k0 + i]} : 0.0);
          gemm_accumulate(acc, kTile, rows, cols, J_, wp + k0 * J_, J_, 1, col + g * J_ * PQ_ + t0, PQ_);
          for (int64_t i = 0; i < rows; ++i) {
            float* yk = yp + n * ys_.n + (k0 + i) * ys_.c;
            const double* a = acc + i * kTile;
            int64_t pp = t0 / Q_, qq = t0 % Q_;
            for (int64_t t = 0; t < cols; ++t) {
              yk[pp * ys_.h + qq * ys_.w] = static_cast<float>(a[t]);
              if (++qq == Q_) qq = 0, ++pp;
            }
          }
        }
      });
    }
  }

  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    const float* wp = w.ptr<float>();
    float* dxp = dx.ptr<float>();
    std::vector<double> dcol(static_cast<size_t>(C_ * R_ * S_ * PQ_));
    std::vector<float> dy_buf;
    const int64_t n_jb = ceil_div(J_, kRows), n_tiles = ceil_div(PQ_, kTile);
    for (int64_t n = 0; n < N_; ++n) {
      const float* dyn = output_rows(dy_buf, dy.ptr<float>(), n);
      // dcol[g*J + j][pq] = sum_{k in group g} w[k][j] * dy[k][pq]
      ThreadPool::global().parallel_for(G_ * n_jb * n_tiles, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
          const int64_t g = task / (n_jb * n_tiles), jb = task / n_tiles % n_jb, tile = task % n_tiles;
          const int64_t j0 = jb * kRows, rows = std::min(kRows, J_ - j0);
          const int64_t t0 = tile * kTile, cols = std::min(kTile, PQ_ - t0);
          double* acc = dcol.data() + (g * J_ + j0) * PQ_ + t0;
          for (int64_t i = 0; i < rows; ++i) std::fill_n(acc + i * PQ_, cols, 0.0);
          gemm_accumulate(acc, PQ_, rows, cols, Kg_, wp + g * Kg_ * J_ + j0, 1, J_, dyn + g * Kg_ * PQ_ + t0, PQ_);
        }
      });
      col2im(dxp, dcol.data(), n);
    }
  }

  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override {
    const float* xp = x.ptr<float>();
    std::vector<double> dw_acc(static_cast<size_t>(K_ * J_), 0.0), db_acc(static_cast<size_t>(K_), 0.0);
    std::vector<float> col_buf, dy_buf;
    for (int64_t n = 0; n < N_; ++n) {
      const float* col = columns(col_buf, xp, n);
      const float* dyn = output_rows(dy_buf, dy.ptr<float>(), n);
      ThreadPool::global().parallel_for(K_, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const float* dyk = dyn + k * PQ_;
          const float* colg = col + (k / Kg_) * J_ * PQ_;
          double* out = dw_acc.data() + k * J_;
          for (int64_t j0 = 0; j0 < J_; j0 += 4) {
            dot_rows_accumulate(out + j0, std::min<int64_t>(4, J_ - j0), dyk, colg + j0 * PQ_, PQ_, PQ_);
          }
          if (db) {
            double s = 0.0;
            for (int64_t t = 0; t < PQ_; ++t) s += dyk[t];
            db_acc[static_cast<size_t>(k)] += s;
          }
        }
      });
    }
    float* dwp = dw.ptr<float>();
    for (int64_t i = 0; i < K_ * J_; ++i) dwp[i] = static_cast<float>(dwp[i] + dw_acc[static_cast<size_t>(i)]);
    if (db) {
      float* dbp = db->ptr<float>();
      for (int64_t k = 0; k < K_; ++k) dbp[k] = static_cast<float>(dbp[k] + db_acc[static_cast<size_t>(k)]);
    }
  }

 private:
  // The column matrix of image n, [C * R * S][P * Q] (group g's rows start at g * J).
  const float* columns(std::vector<float>& buf, const float* x, int64_t n) const {
    if (direct_) return x + n * xs_.n;
    buf.resize(static_cast<size_t>(C_ * R_ * S_ * PQ_));
    float* col = buf.data();
    const auto& p = desc_.p;
    ThreadPool::global().parallel_for(C_ * R_ * S_, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t c = row / (R_ * S_), r = row / S_ % R_, s = row % S_;
        const int64_t w_off = s * p.dilation_w - p.pad_w;
        int64_t q_lo, q_hi;
        valid_range(Q_, p.stride_w, w_off, W_, &q_lo, &q_hi);
        const float* xc = x + n * xs_.n + c * xs_.c;
        for (int64_t pp = 0; pp < P_; ++pp) {
          float* dst = col + row * PQ_ + pp * Q_;
          const int64_t ih = pp * p.stride_h - p.pad_h + r * p.dilation_h;
          if (ih < 0 || ih >= H_) {
            std::fill_n(dst, Q_, 0.0f);
            continue;
          }
          const float* src = xc + ih * xs_.h;
          const int64_t step = p.stride_w * xs_.w, first = w_off * xs_.w;
          std::fill_n(dst, q_lo, 0.0f);
          for (int64_t q = q_lo; q < q_hi; ++q) dst[q] = src[q * step + first];
          std::fill(dst + q_hi, dst + Q_, 0.0f);
        }
      }
    });
    return col;
  }

  // The rows dy[k][pq] of image n, [K][P * Q]: a view of dy itself in NCHW, a copy in NHWC.
  const float* output_rows(std::vector<float>& buf, const float* dy, int64_t n) const {
    if (ys_.w == 1) return dy + n * ys_.n;
    buf.resize(static_cast<size_t>(K_ * PQ_));
    float* out = buf.data();
    const float* dyn = dy + n * ys_.n;
    ThreadPool::global().parallel_for(PQ_, [&](int64_t begin, int64_t end) {
      for (int64_t pq = begin; pq < end; ++pq) {
        const float* src = dyn + (pq / Q_) * ys_.h + (pq % Q_) * ys_.w;
        for (int64_t k = 0; k < K_; ++k) out[k * PQ_ + pq] = src[k * ys_.c];
      }
    });
    return out;
  }

  // dx[n][c] = sum over the (r, s) rows of channel c of dcol scattered back to the input
  // positions they were read from; one fp64 plane per channel.
  void col2im(float* dx, const double* dcol, int64_t n) const {
    const auto& p = desc_.p;
    ThreadPool::global().parallel_for(C_, [&](int64_t begin, int64_t end) {
      std::vector<double> plane(static_cast<size_t>(H_ * W_));
      for (int64_t c = begin; c < end; ++c) {
        std::fill(plane.begin(), plane.end(), 0.0);
        for (int64_t r = 0; r < R_; ++r) {
          for (int64_t s = 0; s < S_; ++s) {
            const double* row = dcol + ((c * R_ + r) * S_ + s) * PQ_;
            const int64_t w_off = s * p.dilation_w - p.pad_w;
            int64_t q_lo, q_hi;
            valid_range(Q_, p.stride_w, w_off, W_, &q_lo, &q_hi);
            for (int64_t pp = 0; pp < P_; ++pp) {
              const int64_t ih = pp * p.stride_h - p.pad_h + r * p.dilation_h;
              if (ih < 0 || ih >= H_) continue;
              double* dst = plane.data() + ih * W_;
              const double* src = row + pp * Q_;
              for (int64_t q = q_lo; q < q_hi; ++q) dst[q * p.stride_w + w_off] += src[q];
            }
          }
        }
        float* dxc = dx + n * xs_.n + c * xs_.c;
        for (int64_t h = 0; h < H_; ++h) {
          for (int64_t w = 0; w < W_; ++w) dxc[h * xs_.h + w * xs_.w] = static_cast<float>(plane[h * W_ + w]);
        }
      }
    });
  }

  int64_t N_, C_, H_, W_, K_, P_, Q_, R_, S_, G_, Cg_, Kg_, J_, PQ_;
  Strides4 xs_, ys_;
  bool direct_;
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  return std::make_unique<RefConv2d>(d);
}

}  // namespace rn::ref

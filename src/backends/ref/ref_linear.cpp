// Reference linear layer, x[N, I], w[O, I] (PyTorch's layout), y[N, O], fp64 sums:
//   forward:          y[n][o]  = sum_i x[n][i] w[o][i] + b[o]
//   backward data:    dx[n][i] = sum_o dy[n][o] w[o][i]           (overwritten)
//   backward weights: dw[o][i] += sum_n dy[n][o] x[n][i];  db[o] += sum_n dy[n][o]
#include <algorithm>

#include "backends/ref/ref_blas.h"
#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

class RefLinear final : public LinearKernel {
 public:
  using LinearKernel::LinearKernel;

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override {
    const int64_t N = desc_.batch, I = desc_.in_features, O = desc_.out_features;
    const float* xp = x.ptr<float>();
    const float* wp = w.ptr<float>();
    const float* bp = b ? b->ptr<float>() : nullptr;
    float* yp = y.ptr<float>();
    const int64_t n_ob = ceil_div(O, kRows);
    ThreadPool::global().parallel_for(N * n_ob, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t n = task / n_ob, o0 = task % n_ob * kRows, rows = std::min(kRows, O - o0);
        double out[kRows] = {};
        dot_rows_accumulate(out, rows, xp + n * I, wp + o0 * I, I, I);
        for (int64_t i = 0; i < rows; ++i) {
          yp[n * O + o0 + i] = static_cast<float>(out[i] + (bp ? double{bp[o0 + i]} : 0.0));
        }
      }
    });
  }

  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    const int64_t N = desc_.batch, I = desc_.in_features, O = desc_.out_features;
    const float* dyp = dy.ptr<float>();
    const float* wp = w.ptr<float>();
    float* dxp = dx.ptr<float>();
    const int64_t n_nb = ceil_div(N, kRows), n_tiles = ceil_div(I, kTile);
    ThreadPool::global().parallel_for(n_nb * n_tiles, [&](int64_t begin, int64_t end) {
      double acc[kRows * kTile];
      for (int64_t task = begin; task < end; ++task) {
        const int64_t n0 = task / n_tiles * kRows, rows = std::min(kRows, N - n0);
        const int64_t t0 = task % n_tiles * kTile, cols = std::min(kTile, I - t0);
        std::fill_n(acc, kRows * kTile, 0.0);
        // acc[n][i] = sum_o dy[n][o] * w[o][i]
        gemm_accumulate(acc, kTile, rows, cols, O, dyp + n0 * O, O, 1, wp + t0, I);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t t = 0; t < cols; ++t) dxp[(n0 + r) * I + t0 + t] = static_cast<float>(acc[r * kTile + t]);
        }
      }
    });
  }

  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override {
    const int64_t N = desc_.batch, I = desc_.in_features, O = desc_.out_features;
    const float* dyp = dy.ptr<float>();
    const float* xp = x.ptr<float>();
    float* dwp = dw.ptr<float>();
    const int64_t n_ob = ceil_div(O, kRows), n_tiles = ceil_div(I, kTile);
    ThreadPool::global().parallel_for(n_ob * n_tiles, [&](int64_t begin, int64_t end) {
      double acc[kRows * kTile];
      for (int64_t task = begin; task < end; ++task) {
        const int64_t o0 = task / n_tiles * kRows, rows = std::min(kRows, O - o0);
        const int64_t t0 = task % n_tiles * kTile, cols = std::min(kTile, I - t0);
        std::fill_n(acc, kRows * kTile, 0.0);
        // acc[o][i] = sum_n dy[n][o] * x[n][i]
        gemm_accumulate(acc, kTile, rows, cols, N, dyp + o0, 1, O, xp + t0, I);
        for (int64_t r = 0; r < rows; ++r) {
          float* dw_row = dwp + (o0 + r) * I + t0;
          for (int64_t t = 0; t < cols; ++t) dw_row[t] = static_cast<float>(dw_row[t] + acc[r * kTile + t]);
        }
      }
    });
    if (db) {
      float* dbp = db->ptr<float>();
      for (int64_t o = 0; o < O; ++o) {
        double s = 0.0;
        for (int64_t n = 0; n < N; ++n) s += dyp[n * O + o];
        dbp[o] = static_cast<float>(dbp[o] + s);
      }
    }
  }
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  return std::make_unique<RefLinear>(d);
}

}  // namespace rn::ref

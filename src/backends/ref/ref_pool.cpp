// Reference pooling, one (n, c) plane per task.
//
// max_pool2d: each window is clipped to the input (padding never wins); the first maximum
// in (r, s) scan order wins ties; a NaN in the window wins (as in PyTorch). The workspace
// holds, per output element and in y's memory order, the int32 index ih * W + iw of the
// winner within its (n, c) input plane: workspace_bytes() = numel(y) * 4. Backward
// scatters dy to those positions, summing overlaps in fp64; dx is overwritten.
// global_avg_pool: y[n][c] = mean over H, W (fp64 sum); dx = dy / (H * W) broadcast.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/ref/ref_kernels.h"
#include "core/thread_pool.h"

namespace rn::ref {
namespace {

class RefMaxPool final : public MaxPoolKernel {
 public:
  explicit RefMaxPool(const MaxPoolDesc& d)
      : MaxPoolKernel(d),
        xs_(strides4(d.channels, d.in_h, d.in_w, d.layout)),
        ys_(strides4(d.channels, d.out_h(), d.out_w(), d.layout)) {}

  size_t workspace_bytes() const override { return static_cast<size_t>(desc_.y_shape().numel()) * sizeof(int32_t); }

 protected:
  void do_forward(const Tensor& y, const Tensor& workspace, const Tensor& x) override {
    const auto& d = desc_;
    const int64_t P = d.out_h(), Q = d.out_w(), H = d.in_h, W = d.in_w;
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    auto* arg = static_cast<int32_t*>(workspace.data);
    ThreadPool::global().parallel_for(d.batch * d.channels, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t n = nc / d.channels, c = nc % d.channels;
        const float* xc = xp + n * xs_.n + c * xs_.c;
        const int64_t y_base = n * ys_.n + c * ys_.c;
        for (int64_t p = 0; p < P; ++p) {
          const int64_t h0 = std::max<int64_t>(p * d.stride - d.pad, 0);
          const int64_t h1 = std::min(p * d.stride - d.pad + d.kernel, H);
          for (int64_t q = 0; q < Q; ++q) {
            const int64_t w0 = std::max<int64_t>(q * d.stride - d.pad, 0);
            const int64_t w1 = std::min(q * d.stride - d.pad + d.kernel, W);
            RN_CHECK(h0 < h1 && w0 < w1) << d.str() << ": empty window at output (" << p << ", " << q << ")";
            int64_t best_i = h0 * W + w0;
            float best = xc[h0 * xs_.h + w0 * xs_.w];
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) {
                const float v = xc[h * xs_.h + w * xs_.w];
                if (v > best || (std::isnan(v) && !std::isnan(best))) best = v, best_i = h * W + w;
              }
            }
            const int64_t o = y_base + p * ys_.h + q * ys_.w;
            yp[o] = best;
            arg[o] = static_cast<int32_t>(best_i);
          }
        }
      }
    });
  }

  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace) override {
    const auto& d = desc_;
    const int64_t P = d.out_h(), Q = d.out_w(), H = d.in_h, W = d.in_w;
    const float* dyp = dy.ptr<float>();
    float* dxp = dx.ptr<float>();
    const auto* arg = static_cast<const int32_t*>(workspace.data);
    ThreadPool::global().parallel_for(d.batch * d.channels, [&](int64_t begin, int64_t end) {
      std::vector<double> plane(static_cast<size_t>(H * W));
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t n = nc / d.channels, c = nc % d.channels;
        std::fill(plane.begin(), plane.end(), 0.0);
        const int64_t y_base = n * ys_.n + c * ys_.c;
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t q = 0; q < Q; ++q) {
            const int64_t o = y_base + p * ys_.h + q * ys_.w;
            const int64_t i = arg[o];
            RN_CHECK(i >= 0 && i < H * W) << d.str() << ": corrupt workspace index " << i;
            plane[static_cast<size_t>(i)] += dyp[o];
          }
        }
        float* dxc = dxp + n * xs_.n + c * xs_.c;
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t w = 0; w < W; ++w) dxc[h * xs_.h + w * xs_.w] = static_cast<float>(plane[h * W + w]);
        }
      }
    });
  }

 private:
  Strides4 xs_, ys_;
};

class RefGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  explicit RefGlobalAvgPool(const GlobalAvgPoolDesc& d)
      : GlobalAvgPoolKernel(d), xs_(strides4(d.channels, d.h, d.w, d.layout)) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    const int64_t hw = desc_.h * desc_.w, step = xs_.w;  // h * W + w steps by the w stride
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    ThreadPool::global().parallel_for(desc_.batch * desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const float* xc = xp + (nc / desc_.channels) * xs_.n + (nc % desc_.channels) * xs_.c;
        double sum = 0.0;
        for (int64_t i = 0; i < hw; ++i) sum += xc[i * step];
        yp[nc] = static_cast<float>(sum / static_cast<double>(hw));
      }
    });
  }

  void do_backward(const Tensor& dx, const Tensor& dy) override {
    const int64_t hw = desc_.h * desc_.w, step = xs_.w;
    const float* dyp = dy.ptr<float>();
    float* dxp = dx.ptr<float>();
    ThreadPool::global().parallel_for(desc_.batch * desc_.channels, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        float* dxc = dxp + (nc / desc_.channels) * xs_.n + (nc % desc_.channels) * xs_.c;
        const auto g = static_cast<float>(static_cast<double>(dyp[nc]) / static_cast<double>(hw));
        for (int64_t i = 0; i < hw; ++i) dxc[i * step] = g;
      }
    });
  }

 private:
  Strides4 xs_;
};

}  // namespace

std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  RN_CHECK(d.in_h * d.in_w <= INT32_MAX) << d.str() << ": plane too large for int32 workspace indices";
  return std::make_unique<RefMaxPool>(d);
}

std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) {
  d.validate();
  require_f32(d.dtype, d.str());
  return std::make_unique<RefGlobalAvgPool>(d);
}

}  // namespace rn::ref

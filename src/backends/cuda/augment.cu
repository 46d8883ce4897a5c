// crop_flip_normalize on the device (ops/augment.h): one thread per output element, the
// arithmetic of fused::crop_flip_source_x / normalize_u8 (tested on the CPU against the
// loader's Normalizer), the per-channel mean and std in device memory.
#include <memory>
#include <vector>

#include "backends/cuda/context.h"
#include "backends/cuda/device_types.cuh"
#include "ops/fused_math.h"

namespace rn::cuda {
namespace {

constexpr int kThreads = 256;

// y is NHWC [N, out_h, out_w, C] (the backend's layout); x is NHWC u8.
template <typename T>
__global__ void crop_flip_normalize_kernel(T* y, const uint8_t* x, const int32_t* crops, const float* mean,
                                           const float* stdv, int64_t N, int64_t C, int64_t H, int64_t W, int64_t P,
                                           int64_t Q) {
  const int64_t n_out = N * P * Q * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_out;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t c = i % C, q = (i / C) % Q, p = (i / (C * Q)) % P, n = i / (C * Q * P);
    const int64_t sy = crops[n * 3] + p;
    const int64_t sx = fused::crop_flip_source_x(q, crops[n * 3 + 1], Q, crops[n * 3 + 2] != 0);
    const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
    const uint8_t v = inside ? x[((n * H + sy) * W + sx) * C + c] : 0;
    y[i] = from_f32<T>(fused::normalize_u8(v, mean[c], stdv[c]));
  }
}

class CudaCropFlipNormalize final : public CropFlipNormalizeKernel {
 public:
  CudaCropFlipNormalize(const ContextPtr& ctx, const CropFlipNormalizeDesc& d) : CropFlipNormalizeKernel(d), ctx_(ctx) {
    std::vector<float> stats(static_cast<size_t>(2 * d.channels));
    for (int64_t c = 0; c < d.channels; ++c) {
      stats[static_cast<size_t>(c)] = d.mean_of(c);
      stats[static_cast<size_t>(d.channels + c)] = d.std_of(c);
    }
    stats_ = DeviceBuffer(ctx_->memory(), stats.size() * sizeof(float));
    ctx_->memory().copy(stats_.data(), stats.data(), stats.size() * sizeof(float));
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& crops) override {
    const CropFlipNormalizeDesc& d = desc_;
    const float* mean = static_cast<const float*>(stats_.data());
    const int64_t n = d.batch * d.out_h * d.out_w * d.channels;
    RN_DISPATCH_FLOAT(d.dtype, T, {
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, ctx_->stream(), crop_flip_normalize_kernel<T>)(
          static_cast<T*>(y.data), x.ptr<uint8_t>(), crops.ptr<int32_t>(), mean, mean + d.channels, d.batch, d.channels,
          d.src_h, d.src_w, d.out_h, d.out_w);
      RN_CUDA_LAUNCH_CHECK();
    });
  }

 private:
  ContextPtr ctx_;
  DeviceBuffer stats_;
};

}  // namespace

std::unique_ptr<CropFlipNormalizeKernel> make_crop_flip_normalize(const ContextPtr& ctx,
                                                                  const CropFlipNormalizeDesc& d) {
  d.validate();
  require_nhwc(d.layout, d.str());
  return std::make_unique<CudaCropFlipNormalize>(ctx, d);
}

}  // namespace rn::cuda

// The device's crop, flip and normalisation (backends/cuda/augment.cu) against the host's
// (ops/augment.h, make_host_crop_flip_normalize): the same bits in every dtype, crops that
// reach into the zero padding on every side, flipped and not. Built twice, as
// cuda_kernels_test.cpp is: CudaAugment.* on a GPU (test_ops), CudaAugmentOnCpu.* in the CPU
// emulation (test_cuda_sim).
#if defined(RN_HAVE_CUDA) || defined(RN_CUDA_SIM)
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/augment.h"
#include "ops/backend.h"

#include "cuda_test_util.h"

#ifdef RN_CUDA_SIM
#define CudaAugment CudaAugmentOnCpu
#endif

namespace rn::cuda {
namespace {

using namespace rn::cuda::testing;

TEST(CudaAugment, CropFlipNormalizeMatchesTheHost) {
  RN_REQUIRE_GPU();
  const std::unique_ptr<Backend> backend = make_backend("cuda");
  Rng rng(31);
  CropFlipNormalizeDesc d;
  d.batch = 5, d.channels = 3, d.src_h = 13, d.src_w = 11, d.out_h = 8, d.out_w = 9;
  d.mean = {0.485f, 0.456f, 0.406f};
  d.std = {0.229f, 0.224f, 0.225f};
  d.layout = Layout::nhwc;
  std::vector<uint8_t> x(static_cast<size_t>(d.x_shape().numel()));
  for (uint8_t& v : x) v = static_cast<uint8_t>(rng.below(256));
  // (y0, x0, flip): inside; into the padding above/left; below/right; flipped at both edges.
  const std::vector<int32_t> crops = {2, 1, 0, -3, -4, 1, 9, 6, 0, -2, 5, 1, 0, 0, 1};
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    d.dtype = t;
    const auto ny = static_cast<size_t>(d.y_shape().numel());
    void *xd = nullptr, *cd = nullptr;
    RN_CUDA_CHECK(cudaMalloc(&xd, x.size()));
    RN_CUDA_CHECK(cudaMalloc(&cd, crops.size() * sizeof(int32_t)));
    RN_CUDA_CHECK(cudaMemcpy(xd, x.data(), x.size(), cudaMemcpyHostToDevice));
    RN_CUDA_CHECK(cudaMemcpy(cd, crops.data(), crops.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    RN_CUDA_CHECK(cudaDeviceSynchronize());  // see Buf::set
    Buf yd(t, ny);
    const auto dev = backend->make_crop_flip_normalize(d);
    const Device where = Device::cuda;
    auto tensor = [&](void* p, const Shape& s, DType dt, Device dv) {
      Tensor v;
      v.data = p, v.shape = s, v.dtype = dt, v.layout = Layout::nhwc, v.device = dv;
      return v;
    };
    dev->forward(tensor(yd.data(), d.y_shape(), t, where), tensor(xd, d.x_shape(), DType::u8, where),
                 tensor(cd, {d.batch, 3}, DType::i32, where));
    std::vector<char> y_raw(ny * elem_size(t));
    std::vector<uint8_t> x_host = x;
    std::vector<int32_t> c_host = crops;
    make_host_crop_flip_normalize(d)->forward(tensor(y_raw.data(), d.y_shape(), t, Device::cpu),
                                              tensor(x_host.data(), d.x_shape(), DType::u8, Device::cpu),
                                              tensor(c_host.data(), {d.batch, 3}, DType::i32, Device::cpu));
    std::vector<float> want(ny);
    convert(want.data(), DType::f32, y_raw.data(), t, ny);
    std::string at;
    EXPECT_TRUE(same_bits(yd.get(), want, &at)) << at;
    cudaFree(xd);
    cudaFree(cd);
  }
}

}  // namespace
}  // namespace rn::cuda
#endif  // RN_HAVE_CUDA || RN_CUDA_SIM

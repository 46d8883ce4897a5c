// linear on cuBLAS (cublasGemmEx, fp32 compute for every dtype). Row-major x[N,I],
// w[O,I], y[N,O] are column-major X(I,N), W(I,O), Y(O,N):
//   y = x w^T     ->  Y  = W^T X      (m=O, n=N, k=I)
//   dx = dy w     ->  DX = W DY       (m=I, n=N, k=O)
//   dw += dy^T x  ->  DW += X DY^T    (m=I, n=O, k=N; DW fp32, beta 1: accumulates)
// Bias: a broadcast-add kernel forward and a fixed-order column sum backward.
#include "backends/cuda/context.h"
#include "backends/cuda/kernels.h"

namespace rn::cuda {
namespace {

class CublasLinear final : public LinearKernel {
 public:
  CublasLinear(const ContextPtr& ctx, const LinearDesc& d) : LinearKernel(d), ctx_(ctx) {
    if (d.bias) ctx_->reserve(static_cast<size_t>(channel_partials_floats(d.batch, d.out_features)) * 4);
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override {
    const LinearDesc& d = desc_;
    const cudaDataType_t t = cuda_dtype(d.dtype);
    const float one = 1.0f, zero = 0.0f;
    const int O = static_cast<int>(d.out_features), N = static_cast<int>(d.batch), I = static_cast<int>(d.in_features);
    RN_CUBLAS_CHECK(cublasGemmEx(ctx_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, &one, w.data, t, I, x.data, t, I,
                                 &zero, y.data, t, O, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (b) launch_bias_add(y.data, b->ptr<float>(), d.dtype, d.batch, d.out_features, ctx_->stream());
  }

  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    const LinearDesc& d = desc_;
    const cudaDataType_t t = cuda_dtype(d.dtype);
    const float one = 1.0f, zero = 0.0f;
    const int O = static_cast<int>(d.out_features), N = static_cast<int>(d.batch), I = static_cast<int>(d.in_features);
    RN_CUBLAS_CHECK(cublasGemmEx(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, &one, w.data, t, I, dy.data, t, O,
                                 &zero, dx.data, t, I, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override {
    const LinearDesc& d = desc_;
    const cudaDataType_t t = cuda_dtype(d.dtype);
    const float one = 1.0f;
    const int O = static_cast<int>(d.out_features), N = static_cast<int>(d.batch), I = static_cast<int>(d.in_features);
    RN_CUBLAS_CHECK(cublasGemmEx(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, &one, x.data, t, I, dy.data, t, O,
                                 &one, dw.data, CUDA_R_32F, I, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (db)
      launch_bias_grad(db->ptr<float>(), dy.data, d.dtype, d.batch, d.out_features,
                       static_cast<float*>(ctx_->workspace()), ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const ContextPtr& ctx, const LinearDesc& d) {
  d.validate();
  return std::make_unique<CublasLinear>(ctx, d);
}

}  // namespace rn::cuda

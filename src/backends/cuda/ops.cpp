// The CUDA kernels of the ops without a library implementation: batch norm (fused ReLU /
// add+ReLU), ReLU, add, cast, max and global average pooling, softmax cross-entropy. The
// arithmetic is in kernels.cu; this file holds the op classes and the scratch layout.
#include "backends/cuda/context.h"
#include "backends/cuda/kernels.h"

namespace rn::cuda {
namespace {

size_t aligned(size_t v) { return align_up(v, 256); }

// ---- batch norm -------------------------------------------------------------------------
// Scratch: [mean C][var C][sum_dy C][sum_dy_xhat C][mismatch flag][partials].
class CudaBatchNorm final : public BatchNormKernel {
 public:
  CudaBatchNorm(const ContextPtr& ctx, const BatchNormDesc& d) : BatchNormKernel(d), ctx_(ctx) {
    M_ = d.batch * d.h * d.w;
    stat_bytes_ = aligned(static_cast<size_t>(d.channels) * 4);
    partials_at_ = 4 * stat_bytes_ + 256;
    ctx_->reserve(partials_at_ + static_cast<size_t>(channel_partials_floats(M_, d.channels)) * 4);
  }

 protected:
  float* stat(int i) const { return reinterpret_cast<float*>(static_cast<char*>(ctx_->workspace()) + i * stat_bytes_); }
  int* mismatch() const { return reinterpret_cast<int*>(static_cast<char*>(ctx_->workspace()) + 4 * stat_bytes_); }
  float* partials() const { return reinterpret_cast<float*>(static_cast<char*>(ctx_->workspace()) + partials_at_); }
  int fuse() const { return static_cast<int>(desc_.fuse); }
  double* sums() const { return static_cast<double*>(sums_->data()); }

  // Synchronised BN: per-channel sums in double, all-reduced in device memory (NCCL) on the
  // compute stream's order; no host synchronisation.
  void do_set_stats_reducer(BatchStatsReducer* r) override {
    if (r != nullptr && !r->on_device())
      RN_UNSUPPORTED() << desc_.str()
                       << ": synchronised batch norm on the GPU needs a device reducer (NCCL); this one sums host "
                          "memory";
    if (r != nullptr && !sums_) {
      const size_t n = static_cast<size_t>(2 * desc_.channels + 1);
      sums_ = std::make_unique<DeviceBuffer>(ctx_->memory(), n * sizeof(double));
      forward_sums_ = std::make_unique<DeviceBuffer>(ctx_->memory(), n * sizeof(double));
      forward_saved_ = std::make_unique<DeviceBuffer>(ctx_->memory(), static_cast<size_t>(2 * desc_.channels) * 4);
    }
    // Nothing to compare with before the next synchronised forward_training: a recompute
    // before it fails (0xff.. is a NaN no sum produces).
    if (r != nullptr)
      RN_CUDA_CHECK(cudaMemsetAsync(forward_sums_->data(), 0xff, forward_sums_->bytes(), ctx_->stream()));
  }

  void do_forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& x,
                           const Tensor* residual, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var) override {
    RN_CHECK(M_ > 1) << desc_.str() << ": training needs more than one value per channel (N*H*W = " << M_ << ")";
    const int64_t C = desc_.channels;
    cudaStream_t s = ctx_->stream();
    if (BatchStatsReducer* r = stats_reducer()) {
      launch_bn_sync_forward_sums(sums(), x.data, desc_.dtype, M_, C, partials(), s);
      // This rank's sums, for forward_recompute's check (it must not communicate).
      RN_CUDA_CHECK(cudaMemcpyAsync(forward_sums_->data(), sums(), static_cast<size_t>(2 * C) * sizeof(double),
                                    cudaMemcpyDeviceToDevice, s));
      r->sum(sums(), 2 * C + 1);
      launch_bn_sync_finish_forward(saved_mean.ptr<float>(), saved_invstd.ptr<float>(), running_mean.ptr<float>(),
                                    running_var.ptr<float>(), sums(), desc_.eps, desc_.momentum, C, s);
      char* saved = static_cast<char*>(forward_saved_->data());
      RN_CUDA_CHECK(cudaMemcpyAsync(saved, saved_mean.data, static_cast<size_t>(C) * 4, cudaMemcpyDeviceToDevice, s));
      RN_CUDA_CHECK(
          cudaMemcpyAsync(saved + C * 4, saved_invstd.data, static_cast<size_t>(C) * 4, cudaMemcpyDeviceToDevice, s));
      launch_bn_apply(y.data, x.data, residual ? residual->data : nullptr, desc_.dtype, M_, C, saved_mean.ptr<float>(),
                      saved_invstd.ptr<float>(), false, desc_.eps, gamma.ptr<float>(), beta.ptr<float>(), fuse(), s);
      return;
    }
    launch_bn_stats(stat(0), stat(1), x.data, desc_.dtype, M_, C, partials(), s);
    launch_bn_finish_training(saved_mean.ptr<float>(), saved_invstd.ptr<float>(), running_mean.ptr<float>(),
                              running_var.ptr<float>(), stat(0), stat(1), desc_.eps, desc_.momentum, M_, C, s);
    launch_bn_apply(y.data, x.data, residual ? residual->data : nullptr, desc_.dtype, M_, C, saved_mean.ptr<float>(),
                    saved_invstd.ptr<float>(), false, desc_.eps, gamma.ptr<float>(), beta.ptr<float>(), fuse(), s);
  }

  void do_forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) override {
    launch_bn_apply(y.data, x.data, residual ? residual->data : nullptr, desc_.dtype, M_, desc_.channels,
                    running_mean.ptr<float>(), running_var.ptr<float>(), true, desc_.eps, gamma.ptr<float>(),
                    beta.ptr<float>(), fuse(), ctx_->stream());
  }

  // The statistics are recomputed by the same fixed-order reduction and compared bit for
  // bit on the device; reading the verdict synchronises (memory level O2 only).
  void do_forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                            const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) override {
    const int64_t C = desc_.channels;
    cudaStream_t s = ctx_->stream();
    RN_CUDA_CHECK(cudaMemsetAsync(mismatch(), 0, sizeof(int), s));
    if (stats_reducer()) {
      // Synchronised: no communication here. This rank's sums and the saved (global)
      // statistics must be those of the last forward_training, bit for bit.
      launch_bn_sync_forward_sums(sums(), x.data, desc_.dtype, M_, C, partials(), s);
      launch_words_differ(mismatch(), sums(), forward_sums_->data(), 4 * C, s);  // 2C doubles
      const char* saved = static_cast<const char*>(forward_saved_->data());
      launch_words_differ(mismatch(), saved_mean.data, saved, C, s);
      launch_words_differ(mismatch(), saved_invstd.data, saved + C * 4, C, s);
    } else {
      launch_bn_stats(stat(0), stat(1), x.data, desc_.dtype, M_, C, partials(), s);
      launch_bn_compare(mismatch(), stat(0), stat(1), saved_mean.ptr<float>(), saved_invstd.ptr<float>(), desc_.eps,
                        C, s);
    }
    launch_bn_apply(y.data, x.data, residual ? residual->data : nullptr, desc_.dtype, M_, C, saved_mean.ptr<float>(),
                    saved_invstd.ptr<float>(), false, desc_.eps, gamma.ptr<float>(), beta.ptr<float>(), fuse(), s);
    int bad = 0;
    RN_CUDA_CHECK(cudaMemcpyAsync(&bad, mismatch(), sizeof(int), cudaMemcpyDeviceToHost, s));
    RN_CUDA_CHECK(cudaStreamSynchronize(s));
    RN_CHECK(bad == 0) << desc_.str()
                       << ": recomputed batch statistics differ from the saved ones (the input changed since "
                          "forward_training)";
  }

  void do_backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                   const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                   const Tensor& saved_invstd) override {
    const int64_t C = desc_.channels;
    cudaStream_t s = ctx_->stream();
    // The gradient reaching the batch norm is g = dy, or dy*(y>0) with the ReLU fused; the
    // kernels mask dy as they read it, so no pass of its own computes g. add_relu: the sums
    // pass also writes g into dresidual (that is dresidual's value), and dx is computed from
    // dresidual unmasked; relu: the dx pass masks dy again, and no masked copy is stored.
    // Tensor-sized passes: sums read dy, y, x (and write dresidual), dx reads dy, y, x (or
    // dresidual, x) and writes dx: 7 with the ReLU fused, 5 without.
    const void* mask = desc_.fuse != BnFuse::none ? y.data : nullptr;
    void* masked_dy = dresidual ? dresidual->data : nullptr;
    const void* dx_dy = dresidual ? dresidual->data : dy.data;
    const void* dx_mask = dresidual ? nullptr : mask;
    if (BatchStatsReducer* r = stats_reducer()) {
      launch_bn_sync_backward_sums(sums(), masked_dy, dy.data, mask, x.data, desc_.dtype, M_, C,
                                   saved_mean.ptr<float>(), saved_invstd.ptr<float>(), partials(), s);
      launch_bn_sync_accumulate(dgamma.ptr<float>(), dbeta.ptr<float>(), sums(), C, s);  // this rank's sums
      r->sum(sums(), 2 * C + 1);
      launch_bn_sync_finish_backward(stat(2), stat(3), sums(), C, s);  // global means of g and g*xhat
      launch_bn_backward_dx(dx.data, dx_dy, dx_mask, x.data, desc_.dtype, M_, C, saved_mean.ptr<float>(),
                            saved_invstd.ptr<float>(), gamma.ptr<float>(), stat(2), stat(3), nullptr, nullptr, s, 1.0f);
      return;
    }
    launch_bn_backward_sums(stat(2), stat(3), masked_dy, dy.data, mask, x.data, desc_.dtype, M_, C,
                            saved_mean.ptr<float>(), saved_invstd.ptr<float>(), partials(), s);
    launch_bn_backward_dx(dx.data, dx_dy, dx_mask, x.data, desc_.dtype, M_, C, saved_mean.ptr<float>(),
                          saved_invstd.ptr<float>(), gamma.ptr<float>(), stat(2), stat(3), dgamma.ptr<float>(),
                          dbeta.ptr<float>(), s);
  }

 private:
  ContextPtr ctx_;
  int64_t M_ = 0;
  size_t stat_bytes_ = 0, partials_at_ = 0;
  // Synchronised BN: the all-reduced sums, and this rank's forward sums for the recompute.
  std::unique_ptr<DeviceBuffer> sums_, forward_sums_, forward_saved_;
};

// ---- element-wise -------------------------------------------------------------------------
class CudaRelu final : public ReluKernel {
 public:
  CudaRelu(const ContextPtr& ctx, const EltwiseDesc& d) : ReluKernel(d), ctx_(ctx) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    launch_relu_forward(y.data, x.data, desc_.dtype, desc_.numel, ctx_->stream());
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    launch_relu_backward(dx.data, dy.data, y.data, desc_.dtype, desc_.numel, ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

class CudaAdd final : public AddKernel {
 public:
  CudaAdd(const ContextPtr& ctx, const EltwiseDesc& d) : AddKernel(d), ctx_(ctx) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& a, const Tensor& b) override {
    launch_add(y.data, a.data, b.data, desc_.dtype, desc_.numel, ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

class CudaCast final : public CastKernel {
 public:
  CudaCast(const ContextPtr& ctx, const CastDesc& d) : CastKernel(d), ctx_(ctx) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    launch_cast(y.data, desc_.dst, x.data, desc_.src, desc_.numel, ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

// ---- pooling -------------------------------------------------------------------------------
class CudaMaxPool final : public MaxPoolKernel {
 public:
  CudaMaxPool(const ContextPtr& ctx, const MaxPoolDesc& d) : MaxPoolKernel(d), ctx_(ctx) {}
  size_t workspace_bytes() const override { return static_cast<size_t>(desc_.y_shape().numel()) * sizeof(int32_t); }

 protected:
  void do_forward(const Tensor& y, const Tensor& workspace, const Tensor& x) override {
    const MaxPoolDesc& d = desc_;
    launch_max_pool_forward(y.data, workspace.ptr<int32_t>(), x.data, d.dtype, d.batch, d.channels, d.in_h, d.in_w,
                            d.out_h(), d.out_w(), d.kernel, d.stride, d.pad, ctx_->stream());
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& workspace) override {
    const MaxPoolDesc& d = desc_;
    launch_max_pool_backward(dx.data, dy.data, workspace.ptr<int32_t>(), d.dtype, d.batch, d.channels, d.in_h, d.in_w,
                             d.out_h(), d.out_w(), d.kernel, d.stride, d.pad, ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

class CudaGlobalAvgPool final : public GlobalAvgPoolKernel {
 public:
  CudaGlobalAvgPool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d) : GlobalAvgPoolKernel(d), ctx_(ctx) {}

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    launch_global_avg_pool_forward(y.data, x.data, desc_.dtype, desc_.batch, desc_.channels, desc_.h * desc_.w,
                                   ctx_->stream());
  }
  void do_backward(const Tensor& dx, const Tensor& dy) override {
    launch_global_avg_pool_backward(dx.data, dy.data, desc_.dtype, desc_.batch, desc_.channels, desc_.h * desc_.w,
                                    ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

// ---- loss -----------------------------------------------------------------------------------
class CudaSoftmaxCrossEntropy final : public SoftmaxCrossEntropyKernel {
 public:
  CudaSoftmaxCrossEntropy(const ContextPtr& ctx, const SoftmaxCrossEntropyDesc& d)
      : SoftmaxCrossEntropyKernel(d), ctx_(ctx) {
    ctx_->reserve(static_cast<size_t>(d.batch) * 4);
  }

 protected:
  void do_forward(const Tensor& loss, const Tensor& probs, const Tensor& logits, const Tensor& labels) override {
    launch_softmax_ce_forward(loss.ptr<float>(), probs.ptr<float>(), static_cast<float*>(ctx_->workspace()),
                              logits.ptr<float>(), labels.ptr<int32_t>(), desc_.batch, desc_.classes,
                              desc_.label_smoothing, ctx_->error_flags(), ctx_->stream());
  }
  void do_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& labels, float grad_scale) override {
    launch_softmax_ce_backward(dlogits.ptr<float>(), probs.ptr<float>(), labels.ptr<int32_t>(), desc_.batch,
                               desc_.classes, desc_.label_smoothing, grad_scale,
                               scale_source() ? scale_source()->ptr<float>() : nullptr, ctx_->stream());
  }

 private:
  ContextPtr ctx_;
};

}  // namespace

std::unique_ptr<BatchNormKernel> make_batch_norm(const ContextPtr& ctx, const BatchNormDesc& d) {
  d.validate();
  require_nhwc(d.layout, d.str());
  if (d.mixed())  // the plan asks only where Backend::bn_half_io() says yes
    RN_UNSUPPORTED() << d.str() << ": the CUDA batch norm takes one data type for x, y and their gradients";
  return std::make_unique<CudaBatchNorm>(ctx, d);
}
std::unique_ptr<ReluKernel> make_relu(const ContextPtr& ctx, const EltwiseDesc& d) {
  d.validate();
  return std::make_unique<CudaRelu>(ctx, d);
}
std::unique_ptr<AddKernel> make_add(const ContextPtr& ctx, const EltwiseDesc& d) {
  d.validate();
  return std::make_unique<CudaAdd>(ctx, d);
}
std::unique_ptr<CastKernel> make_cast(const ContextPtr& ctx, const CastDesc& d) {
  d.validate();
  return std::make_unique<CudaCast>(ctx, d);
}
std::unique_ptr<MaxPoolKernel> make_max_pool(const ContextPtr& ctx, const MaxPoolDesc& d) {
  d.validate();
  require_nhwc(d.layout, d.str());
  return std::make_unique<CudaMaxPool>(ctx, d);
}
std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d) {
  d.validate();
  require_nhwc(d.layout, d.str());
  return std::make_unique<CudaGlobalAvgPool>(ctx, d);
}
std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const ContextPtr& ctx,
                                                                      const SoftmaxCrossEntropyDesc& d) {
  d.validate();
  return std::make_unique<CudaSoftmaxCrossEntropy>(ctx, d);
}

}  // namespace rn::cuda

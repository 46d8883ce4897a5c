// Element-wise ops on oneDNN, over dense storage seen as 1-D (layout does not matter: all
// operands share it): relu (eltwise, backward from the output), add (binary, optionally
// with a relu post-op, which the fused batch norm reuses), cast (reorder for fp32<->bf16;
// fp16 conversions, which oneDNN 2.6 only accelerates on AVX512-FP16 CPUs, use the core
// conversion routines in parallel chunks).
#include "backends/cpu/cpu_common.h"
#include "core/thread_pool.h"

namespace rn::cpu {

ReluMask::ReluMask(const Context& ctx, int64_t numel, DType dtype, const std::string& op, TempLayout& temp)
    : md_(flat_md(numel, dtype)) {
  using fwd_t = dnnl::eltwise_forward;
  using bwd_t = dnnl::eltwise_backward;
  const auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
  const auto attr = user_scratchpad_attr();
  const auto hint = make_pd<fwd_t::primitive_desc>(
      op, "relu forward", fwd_t::desc(dnnl::prop_kind::forward_training, alg, md_, 0.0f), attr, ctx.engine());
  const auto pd =
      make_pd<bwd_t::primitive_desc>(op, "relu backward", bwd_t::desc(alg, md_, md_, 0.0f), attr, ctx.engine(), hint);
  bwd_ = make_step<bwd_t>(pd, temp);
}

void ReluMask::run(Context& ctx, void* dx, const void* dy, const void* y) const {
  execute(ctx, bwd_,
          {{DNNL_ARG_DST, wrap(ctx, md_, y)},
           {DNNL_ARG_DIFF_DST, wrap(ctx, md_, dy)},
           {DNNL_ARG_DIFF_SRC, wrap(ctx, md_, dx)}});
}

AddElementwise::AddElementwise(const Context& ctx, int64_t numel, DType dtype, bool relu, const std::string& op,
                               TempLayout& temp)
    : md_(flat_md(numel, dtype)) {
  auto attr = user_scratchpad_attr();
  if (relu) {
    dnnl::post_ops post;
    post.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(post);
  }
  const auto pd = make_pd<dnnl::binary::primitive_desc>(op, relu ? "add+relu" : "add",
                                                        dnnl::binary::desc(dnnl::algorithm::binary_add, md_, md_, md_),
                                                        attr, ctx.engine());
  add_ = make_step<dnnl::binary>(pd, temp);
}

void AddElementwise::run(Context& ctx, void* y, const void* a, const void* b) const {
  execute(
      ctx, add_,
      {{DNNL_ARG_SRC_0, wrap(ctx, md_, a)}, {DNNL_ARG_SRC_1, wrap(ctx, md_, b)}, {DNNL_ARG_DST, wrap(ctx, md_, y)}});
}

namespace {

class CpuRelu final : public ReluKernel {
 public:
  CpuRelu(const ContextPtr& ctx, const EltwiseDesc& d) : ReluKernel(d), ctx_(ctx) {
    if (d.numel == 0) return;
    const std::string op = "relu " + d.str();
    using fwd_t = dnnl::eltwise_forward;
    md_ = flat_md(d.numel, d.dtype);
    TempLayout t_fwd, t_bwd;
    const auto pd = make_pd<fwd_t::primitive_desc>(
        op, "relu forward",
        fwd_t::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md_, 0.0f),
        user_scratchpad_attr(), ctx->engine());
    fwd_ = make_step<fwd_t>(pd, t_fwd);
    mask_ = ReluMask(*ctx, d.numel, d.dtype, op, t_bwd);
    ctx->reserve_temp(std::max(t_fwd.total(), t_bwd.total()));
    log_implementations(op, {&fwd_, mask_.step()});
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    if (desc_.numel == 0) return;
    execute(*ctx_, fwd_, {{DNNL_ARG_SRC, wrap(*ctx_, md_, x.data)}, {DNNL_ARG_DST, wrap(*ctx_, md_, y.data)}});
  }
  void do_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    if (desc_.numel == 0) return;
    mask_.run(*ctx_, dx.data, dy.data, y.data);
  }

 private:
  ContextPtr ctx_;
  dnnl::memory::desc md_;
  Step fwd_;
  ReluMask mask_;
};

class CpuAdd final : public AddKernel {
 public:
  CpuAdd(const ContextPtr& ctx, const EltwiseDesc& d) : AddKernel(d), ctx_(ctx) {
    if (d.numel == 0) return;
    const std::string op = "add " + d.str();
    TempLayout temp;
    add_ = AddElementwise(*ctx, d.numel, d.dtype, /*relu=*/false, op, temp);
    ctx->reserve_temp(temp.total());
    log_implementations(op, {add_.step()});
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& a, const Tensor& b) override {
    if (desc_.numel == 0) return;
    add_.run(*ctx_, y.data, a.data, b.data);
  }

 private:
  ContextPtr ctx_;
  AddElementwise add_;
};

class CpuCast final : public CastKernel {
 public:
  CpuCast(const ContextPtr& ctx, const CastDesc& d) : CastKernel(d), ctx_(ctx) {
    use_reorder_ = d.numel > 0 && d.src != DType::f16 && d.dst != DType::f16;
    if (!use_reorder_) return;
    src_md_ = flat_md(d.numel, d.src);
    dst_md_ = flat_md(d.numel, d.dst);
    TempLayout temp;
    const auto pd = make_pd<dnnl::reorder::primitive_desc>(d.str(), "reorder", ctx->engine(), src_md_, ctx->engine(),
                                                           dst_md_, user_scratchpad_attr());
    reorder_ = make_step<dnnl::reorder>(pd, temp);
    ctx->reserve_temp(temp.total());
  }

 protected:
  void do_forward(const Tensor& y, const Tensor& x) override {
    if (use_reorder_) {
      execute(*ctx_, reorder_,
              {{DNNL_ARG_FROM, wrap(*ctx_, src_md_, x.data)}, {DNNL_ARG_TO, wrap(*ctx_, dst_md_, y.data)}});
      return;
    }
    const size_t in_size = dtype_size(desc_.src), out_size = dtype_size(desc_.dst);
    constexpr int64_t kChunk = 1 << 16;
    const int64_t chunks = (desc_.numel + kChunk - 1) / kChunk;
    ThreadPool::global().parallel_for(chunks, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t first = i * kChunk, count = std::min(kChunk, desc_.numel - first);
        convert(static_cast<char*>(y.data) + first * out_size, desc_.dst,
                static_cast<const char*>(x.data) + first * in_size, desc_.src, static_cast<size_t>(count));
      }
    });
  }

 private:
  ContextPtr ctx_;
  bool use_reorder_ = false;
  dnnl::memory::desc src_md_, dst_md_;
  Step reorder_;
};

}  // namespace

std::unique_ptr<ReluKernel> make_relu(const ContextPtr& ctx, const EltwiseDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, "relu " + d.str());
  return std::make_unique<CpuRelu>(ctx, d);
}

std::unique_ptr<AddKernel> make_add(const ContextPtr& ctx, const EltwiseDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, "add " + d.str());
  return std::make_unique<CpuAdd>(ctx, d);
}

// A cast computes nothing but a rounding, which every x86 CPU does quickly, so it accepts
// all floating pairs regardless of native bf16 support.
std::unique_ptr<CastKernel> make_cast(const ContextPtr& ctx, const CastDesc& d) {
  d.validate();
  return std::make_unique<CpuCast>(ctx, d);
}

}  // namespace rn::cpu

// conv2d on oneDNN: three primitives (forward, backward data, backward weights) created
// once per descriptor. Activations stay in the caller's layout (nhwc is the fast one: no
// activation reorder happens for a direct convolution); weights use the format each
// primitive prefers (`any`), reordered from PyTorch's OIHW (GOIHW with groups) at each call
// only when it differs. dw, db are computed into fp32 staging memory and then added to the
// caller's (dw += ...).
//
// Winograd (high_performance mode, the default): a 3x3, stride-1, undilated, ungrouped fp32
// convolution whose channels fill oneDNN's 16-wide blocks runs as Winograd F(4x4, 3x3)
// (jit_wino_4x3), which multiplies 2.25x less, measured 1.3-2.4x faster per direction on
// ResNet shapes here. It exists only for oneDNN's blocked activation layout (nChw16c), so the
// activations are reordered into it and back around each call (a memory-bound pass, small
// next to the convolution). Its relative error is ~1e-6 (direct: ~1e-7), within the fp32
// parity bounds; high_precision mode keeps the direct algorithm.
//
// bf16 in fp32 arithmetic (rn::Bf16ConvArithmetic: automatic, the default, takes it where
// this CPU's bf16 dot products are slower than its fp32 FMAs, for the convolutions that pay).
// Without AMX, how fast avx512_bf16's dot product (vdpbf16ps) runs depends on the core:
// dev-2c-xeon's oneDNN bf16 GEMM ran at 0.6x its fp32 one (158 GFLOP/s against 264), dev-2c's
// AMD EPYC at about twice. So automatic measures that ratio once (cpu_bf16_speedup()). Where
// bf16 is slower, a bf16 convolution that does enough work per element runs as an fp32 one on
// the same values: its bf16 operands are widened to fp32 (exactly) by the reorders that feed
// oneDNN's fp32 kernel, and its fp32 result is rounded to bf16 once on the way out, as the
// bf16 kernel rounds its fp32 accumulators. The products are the same exact values, summed in
// fp32 in both, so the two differ only in summation order; dw is fp32 in both. The
// conversions are memory passes, paid for from 96 multiply-adds per activation element read
// or written (x and y), measured per ResNet-50 convolution at batch 16 on dev-2c-xeon
// (bench/micro/micro_conv.cpp, forward and both backwards): its 1x1 convolutions at 32, 51 and
// 85 were 0.85-1.09x as fast converted, those at 102 and more 1.06-1.45x, the stem 1.4x, the
// 3x3 ones 1.3x (stride 2) and 2-2.9x (stride 1, which then run as Winograd like fp32 ones, in
// high_performance mode). Where bf16 is faster, native: on dev-2c (bf16 GEMM 1.7x the fp32
// rate) native bf16 beat fp32 arithmetic on all 18 ResNet-50 convolutions in two runs, by
// 1.1-1.4x on the 3x3 stride-1 ones that run as Winograd in fp32 and 1.5-3.8x on the others
// (bench/RESULTS.md).
// No CPU measured lies between 0.6x and 1.7x; a Winograd convolution just above 1 might still
// gain from fp32 there.
#include "backends/cpu/weighted_op.h"

namespace rn::cpu {
namespace {

// The convolutions oneDNN's Winograd kernel takes (3x3, stride 1, no dilation, no groups,
// fp32, channels in whole 16-wide blocks) and where it pays for the reorders. Per-layer
// profiles (`resnet profile`, 2026-12-01, 2 threads, AVX-512) put the line at 64 channels:
// resnet20 at batch 128, its 32-channel 14x14 layers lost (forward + backward 6.2 ms per
// layer against 4.4 direct) and its 64-channel 7x7 ones won (3.5-3.9 against 4.3); with 16
// channels it lost too; ResNet-50's 64-512 channel layers at batch 16 won in every
// direction. Its fixed costs (a scratchpad of about 10 MiB, the weight transform) pay only
// on convolutions of some size: at least 50M multiply-accumulates (resnet20 at batch 128:
// 231M per layer).
constexpr int64_t kWinogradMinChannels = 64;
constexpr int64_t kWinogradMinMacs = 50'000'000;
// `arithmetic`: the dtype the convolution computes in (arithmetic_dtype below).
bool winograd_eligible(const Conv2dDesc& d, DType arithmetic) {
  const auto& p = d.p;
  return arithmetic == DType::f32 && p.groups == 1 && p.kernel_h == 3 && p.kernel_w == 3 && p.stride_h == 1 &&
         p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1 && p.in_channels % 16 == 0 &&
         p.out_channels % 16 == 0 && p.in_channels >= kWinogradMinChannels && p.out_channels >= kWinogradMinChannels &&
         d.macs() >= kWinogradMinMacs;
}

// The dtype a convolution computes in: fp32 for the ungrouped bf16 ones when asked, or,
// automatically, where bf16 runs slower than fp32 and they do at least this many
// multiply-adds per activation element.
constexpr int64_t kFp32ArithmeticMinMacsPerElement = 96;
DType arithmetic_dtype(const Context& ctx, const Conv2dDesc& d) {
  if (d.dtype != DType::bf16 || d.p.groups != 1) return d.dtype;
  switch (ctx.bf16_conv_arithmetic()) {
    case Bf16ConvArithmetic::native:
      return d.dtype;
    case Bf16ConvArithmetic::fp32:
      return DType::f32;
    case Bf16ConvArithmetic::automatic:
      break;
  }
  if (ctx.bf16_speedup() >= 1) return d.dtype;
  const int64_t elements = d.x_shape().numel() + d.y_shape().numel();
  return d.macs() >= kFp32ArithmeticMinMacsPerElement * elements ? DType::f32 : d.dtype;
}

class CpuConv2d final : public Conv2dKernel {
 public:
  CpuConv2d(const ContextPtr& ctx, const Conv2dDesc& d);
  std::string implementation() const override {
    return arithmetic_ == desc().dtype ? op_.forward_implementation()
                                       : op_.forward_implementation() + " (fp32 arithmetic on bf16 tensors)";
  }
  DType arithmetic() const override { return arithmetic_; }

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override;
  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override;
  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override;

 private:
  WeightedOp op_;
  DType arithmetic_;
};

// Weights of logical shape [K, C/G, R, S]; with groups oneDNN wants [G, K/G, C/G, R, S],
// which is the same memory in goihw.
dims weight_dims(const Conv2dDesc& d) {
  const auto& p = d.p;
  if (p.groups == 1) return {p.out_channels, p.in_channels, p.kernel_h, p.kernel_w};
  return {p.groups, p.out_channels / p.groups, p.in_channels / p.groups, p.kernel_h, p.kernel_w};
}

CpuConv2d::CpuConv2d(const ContextPtr& ctx, const Conv2dDesc& d)
    : Conv2dKernel(d), arithmetic_(arithmetic_dtype(*ctx, d)) {
  const std::string op = d.str();
  const auto& p = d.p;
  const dims wd = weight_dims(d);
  const tag wtag = p.groups == 1 ? tag::oihw : tag::goihw;
  const dt wdt = to_dnnl(d.dtype), adt = to_dnnl(arithmetic_);

  const dnnl::memory::desc x_md = activation_md(d.x_shape(), d.dtype, d.layout);
  const dnnl::memory::desc y_md = activation_md(d.y_shape(), d.dtype, d.layout);
  // fp32 y, dx (f32_y, f32_dx): what the caller passes for them; empty, the half y_md / x_md.
  const dnnl::memory::desc y_out = d.f32_y ? activation_md(d.y_shape(), DType::f32, d.layout) : dnnl::memory::desc();
  const dnnl::memory::desc dx_out = d.f32_dx ? activation_md(d.x_shape(), DType::f32, d.layout) : dnnl::memory::desc();
  const dnnl::memory::desc b_md = p.bias ? dnnl::memory::desc({p.out_channels}, dt::f32, tag::a) : dnnl::memory::desc();
  const dnnl::memory::desc w_user_md(wd, wdt, wtag), dw_user_md(wd, dt::f32, wtag);
  const dnnl::memory::desc w_any(wd, adt, tag::any), dw_any(wd, dt::f32, tag::any);

  const dims strides = {p.stride_h, p.stride_w};
  const dims dilates = {p.dilation_h - 1, p.dilation_w - 1};  // oneDNN counts the gaps
  // Symmetric padding: the output size is floor((in + 2p - span) / stride) + 1 in both
  // conventions, so oneDNN's consistency check holds; rows past the last window are unused.
  const dims pad = {p.pad_h, p.pad_w};
  const auto& eng = ctx->engine();
  const auto attr = user_scratchpad_attr();

  using fwd_t = dnnl::convolution_forward;
  using bwd_data_t = dnnl::convolution_backward_data;
  using bwd_w_t = dnnl::convolution_backward_weights;
  // The three primitives of one algorithm, on activations described by xa / ya; the forward
  // writes y as ya_out and backward data dx as xa_out (where these are empty: ya, xa).
  const auto build = [&](dnnl::algorithm alg, const dnnl::memory::desc& xa, const dnnl::memory::desc& ya,
                         const dnnl::memory::desc& xa_out = {}, const dnnl::memory::desc& ya_out = {}) {
    const fwd_t::desc fwd_desc(dnnl::prop_kind::forward_training, alg, xa, w_any, b_md, ya_out.is_zero() ? ya : ya_out,
                               strides, dilates, pad, pad);
    const auto fwd_pd = make_pd<fwd_t::primitive_desc>(op, "forward convolution", fwd_desc, attr, eng);
    const bwd_data_t::desc bwd_data_desc(alg, xa_out.is_zero() ? xa : xa_out, w_any, ya, strides, dilates, pad, pad);
    const auto bwd_data_pd =
        make_pd<bwd_data_t::primitive_desc>(op, "backward-data convolution", bwd_data_desc, attr, eng, fwd_pd);
    const bwd_w_t::desc bwd_w_desc(alg, xa, dw_any, b_md, ya, strides, dilates, pad, pad);
    const auto bwd_w_pd =
        make_pd<bwd_w_t::primitive_desc>(op, "backward-weights convolution", bwd_w_desc, attr, eng, fwd_pd);
    return WeightedOp::create<fwd_t, bwd_data_t, bwd_w_t>(ctx, op, fwd_pd, bwd_data_pd, bwd_w_pd, x_md, y_md, b_md,
                                                          w_user_md, dw_user_md, p.bias ? p.out_channels : 0, y_out,
                                                          dx_out);
  };
  // Where the activations are reordered anyway (around Winograd, which takes only oneDNN's
  // blocked layout, and where bf16 is widened to fp32), the layout is oneDNN's choice.
  const dnnl::memory::desc x_any(x_md.dims(), adt, tag::any), y_any(y_md.dims(), adt, tag::any);
  if (winograd_eligible(d, arithmetic_) && ctx->winograd()) {
    try {
      op_ = build(dnnl::algorithm::convolution_winograd, x_any, y_any);
      return;
    } catch (const Unsupported&) {
      // this CPU has no Winograd kernel for it (oneDNN's is AVX-512 only): direct, below
    }
  }
  if (arithmetic_ == d.dtype) {
    if (d.f32_y || d.f32_dx) {
      // oneDNN's bf16 kernels write an fp32 dst and diff_src themselves (their accumulators
      // unrounded); where one would not, the same primitives with a cast after them (below).
      try {
        op_ = build(dnnl::algorithm::convolution_direct, x_md, y_md, dx_out, y_out);
        return;
      } catch (const Unsupported&) {
      }
    }
    op_ = build(dnnl::algorithm::convolution_direct, x_md, y_md);
    return;
  }
  // Widened to fp32: oneDNN's layout, unless the input channels do not fill its 16-wide
  // blocks (the stem's 3). Blocked, the stem's input took 5.3x the memory (the padding) and
  // more time; an input in the caller's layout with a blocked output has only oneDNN's
  // reference kernel (200x slower), so both stay in the caller's layout then.
  const tag widened = p.in_channels % 16 == 0 ? tag::any : layout_tag(d.layout);
  op_ = build(dnnl::algorithm::convolution_direct, dnnl::memory::desc(x_md.dims(), adt, widened),
              dnnl::memory::desc(y_md.dims(), adt, widened));
}

void CpuConv2d::do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  op_.forward(x.data, w.data, b ? b->data : nullptr, y.data);
}

void CpuConv2d::do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  op_.backward_data(dy.data, w.data, dx.data);
}

void CpuConv2d::do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  op_.backward_weights(x.data, dy.data, dw.ptr<float>(), db ? db->ptr<float>() : nullptr);
}

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const ContextPtr& ctx, const Conv2dDesc& d) {
  d.validate();
  ctx->require_compute_dtype(d.dtype, d.str());
  return std::make_unique<CpuConv2d>(ctx, d);
}

}  // namespace rn::cpu

// conv2d on cuDNN, NHWC activations. The caller's weights are PyTorch's KCRS; cuDNN's fast
// NHWC kernels want KRSC filters, so each call first transposes the (small) weights into
// the scratch, and the weight gradient comes back in KRSC, in the activation dtype, and is
// then added into the fp32 KCRS gradient (parameter gradients accumulate).
//
// Math: fp32 convolutions use CUDNN_FMA_MATH (no TF32: fp32 parity with PyTorch is a test);
// fp16/bf16 use tensor-op math with fp32 accumulation (cuDNN's PSEUDO_HALF/BFLOAT16 configs).
// Algorithms: cuDNN's measured search, once per key (cudnn_algo_cache.h); in high_precision
// mode or with run.deterministic only deterministic algorithms, ranked by cuDNN's heuristics
// rather than by timing, so that every run takes the same ones.
#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

#include "backends/cuda/context.h"
#include "backends/cuda/kernels.h"
#include "core/log.h"

namespace rn::cuda {
namespace {

constexpr size_t kMaxAlgoWorkspace = size_t{1} << 30;
size_t aligned(size_t v) { return align_up(v, 256); }

enum class Direction { forward, backward_data, backward_filter };
const char* direction_name(Direction d) {
  return d == Direction::forward ? "fwd" : d == Direction::backward_data ? "bwd_data" : "bwd_filter";
}

class CudnnConv final : public Conv2dKernel {
 public:
  CudnnConv(const ContextPtr& ctx, const Conv2dDesc& d);
  ~CudnnConv() override;

 protected:
  void do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) override;
  void do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) override;
  void do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) override;

 private:
  std::string key(Direction dir) const;
  CudnnAlgoChoice choose(Direction dir);
  std::optional<size_t> algo_workspace(Direction dir, int algo, cudnnMathType_t math) const;
  std::string unusable(Direction dir, const CudnnAlgoChoice& c) const;
  void* weights_krsc(const Tensor& w) const;  // the transposed weights in the scratch
  char* scratch() const { return static_cast<char*>(ctx_->workspace()); }
  // fp32 convolutions run with FMA math whatever the algorithm cache says: never TF32.
  void set_math(int math_type) const {
    const auto m = math_ == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : static_cast<cudnnMathType_t>(math_type);
    RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, m));
  }

  ContextPtr ctx_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnMathType_t math_;
  CudnnAlgoChoice fwd_, bwd_data_, bwd_filter_;
  int64_t w_elems_ = 0;
  size_t w_bytes_ = 0, dw_at_ = 0, algo_ws_at_ = 0;
  size_t bias_at_ = 0;
};

CudnnConv::CudnnConv(const ContextPtr& ctx, const Conv2dDesc& d) : Conv2dKernel(d), ctx_(ctx) {
  const Conv2dParams& p = d.p;
  const cudnnDataType_t dt = cudnn_dtype(d.dtype);
  RN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
  RN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
  RN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
  RN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, dt, static_cast<int>(d.batch),
                                            static_cast<int>(p.in_channels), static_cast<int>(d.in_h),
                                            static_cast<int>(d.in_w)));
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, dt, static_cast<int>(d.batch),
                                            static_cast<int>(p.out_channels), static_cast<int>(d.out_h()),
                                            static_cast<int>(d.out_w())));
  RN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, dt, CUDNN_TENSOR_NHWC, static_cast<int>(p.out_channels),
                                            static_cast<int>(p.in_channels / p.groups), static_cast<int>(p.kernel_h),
                                            static_cast<int>(p.kernel_w)));
  RN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w),
                                                 static_cast<int>(p.stride_h), static_cast<int>(p.stride_w),
                                                 static_cast<int>(p.dilation_h), static_cast<int>(p.dilation_w),
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  RN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_, static_cast<int>(p.groups)));
  math_ = d.dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math_));

  w_elems_ = d.w_shape().numel();
  w_bytes_ = aligned(static_cast<size_t>(w_elems_) * dtype_size(d.dtype));
  dw_at_ = w_bytes_;
  algo_ws_at_ = 2 * w_bytes_;
  fwd_ = choose(Direction::forward);
  bwd_data_ = choose(Direction::backward_data);
  bwd_filter_ = choose(Direction::backward_filter);
  const size_t algo_ws = aligned(std::max({fwd_.workspace, bwd_data_.workspace, bwd_filter_.workspace}));
  bias_at_ = algo_ws_at_ + algo_ws;
  const int64_t M = d.batch * d.out_h() * d.out_w();
  const size_t bias_bytes = p.bias ? static_cast<size_t>(channel_partials_floats(M, p.out_channels)) * 4 : 0;
  ctx_->reserve(bias_at_ + bias_bytes);
}

CudnnConv::~CudnnConv() {
  cudnnDestroyConvolutionDescriptor(conv_);
  cudnnDestroyFilterDescriptor(w_);
  cudnnDestroyTensorDescriptor(y_);
  cudnnDestroyTensorDescriptor(x_);
}

std::string CudnnConv::key(Direction dir) const {
  const Conv2dDesc& d = desc_;
  const Conv2dParams& p = d.p;
  std::ostringstream s;
  s << direction_name(dir) << "|" << dtype_name(d.dtype) << "|nhwc|n" << d.batch << "c" << p.in_channels << "h"
    << d.in_h << "w" << d.in_w << "|k" << p.out_channels << "r" << p.kernel_h << "s" << p.kernel_w << "|st"
    << p.stride_h << "x" << p.stride_w << "|pad" << p.pad_h << "x" << p.pad_w << "|dil" << p.dilation_h << "x"
    << p.dilation_w << "|g" << p.groups << "|math" << static_cast<int>(math_) << "|"
    << cuda_impl_mode_name(ctx_->mode()) << (ctx_->deterministic() ? "|det" : "") << "|cudnn" << cudnnGetVersion()
    << "|" << ctx_->gpu_name();
  return s.str();
}

// The usable results, best first: successful, within the workspace limit and, in
// high_precision mode, deterministic. For fp32 data never a tensor-op (TF32) result: FMA
// results first, then the default-math ones, which set_math runs with FMA math anyway (the
// caller then asks cuDNN whether that pair runs, and with how much workspace). When no
// algorithm ran at all, a result that failed for another reason than "not supported" (a
// broken installation, a missing sub-library) is an error, not an unsupported case, so that
// the harness does not turn it into a skip.
template <typename Perf>
std::vector<CudnnAlgoChoice> candidates(const std::vector<Perf>& results, int count, bool deterministic_only,
                                        bool fp32, const std::string& what) {
  bool any_ran = false;
  std::string failures;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[static_cast<size_t>(i)];
    if (r.status != CUDNN_STATUS_SUCCESS && !cudnn_not_supported(r.status))
      failures += (failures.empty() ? "" : ", ") + std::string("algorithm ") + std::to_string(r.algo) + ": " +
                  cudnnGetErrorString(r.status);
    any_ran = any_ran || r.status == CUDNN_STATUS_SUCCESS;
  }
  RN_CHECK(any_ran || failures.empty()) << "cuda backend: every cuDNN algorithm for " << what << " failed ("
                                        << failures << ")";
  std::vector<CudnnAlgoChoice> out;
  for (const cudnnMathType_t only : {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH}) {
    for (int i = 0; i < count; ++i) {
      const Perf& r = results[static_cast<size_t>(i)];
      if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxAlgoWorkspace) continue;
      if (deterministic_only && r.determinism != CUDNN_DETERMINISTIC) continue;
      if (fp32 && r.mathType != only) continue;
      out.push_back({static_cast<int>(r.algo), r.memory, static_cast<int>(fp32 ? CUDNN_FMA_MATH : r.mathType)});
    }
    if (!fp32) break;  // half: any math type, one pass
  }
  return out;
}

// A configuration cuDNN does not implement (shape, type, layout) is unsupported, reported as
// such; any other failure, including a broken installation (driver, sub-library, arch), is
// an error.
void search_status(cudnnStatus_t status, const std::string& what) {
  if (cudnn_not_supported(status))
    RN_UNSUPPORTED() << "cuda backend: cuDNN does not support " << what << ": " << cudnnGetErrorString(status);
  RN_CUDNN_CHECK(status);
}

CudnnAlgoChoice CudnnConv::choose(Direction dir) {
  const std::string k = key(dir);
  // A cached choice over the workspace limit (a file from an older build) is searched again,
  // as is one that cannot run (a file edited by hand), with a warning naming the file.
  if (auto hit = ctx_->algo_cache().find(k); hit && hit->workspace <= kMaxAlgoWorkspace) {
    const std::string why = unusable(dir, *hit);
    if (why.empty()) return *hit;
    RN_LOG_WARN("cuDNN algorithm cache {}: the entry {} is ignored and searched again: {}", ctx_->algo_cache().path(),
                k, why);
  }
  const std::string what = std::string(direction_name(dir)) + " " + desc_.str();
  const bool det = ctx_->deterministic();
  const bool fp32 = desc_.dtype == DType::f32;
  cudnnHandle_t h = ctx_->cudnn();
  constexpr int kAsk = 16;
  int got = 0;
  std::vector<CudnnAlgoChoice> found;
  // The measured search allocates its own buffers (the plan's do not exist yet). Deterministic
  // runs ask cuDNN's heuristics instead: a measured search can rank the algorithms otherwise
  // on another run (timing noise), and another algorithm sums in another order, so two runs
  // that each searched (a cold or disabled cache) would not be bit-identical.
  if (dir == Direction::forward) {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> r(kAsk);
    search_status(det ? cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, kAsk, &got, r.data())
                      : cudnnFindConvolutionForwardAlgorithm(h, x_, w_, conv_, y_, kAsk, &got, r.data()),
                  what);
    found = candidates(r, got, det, fp32, what);
  } else if (dir == Direction::backward_data) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(kAsk);
    search_status(det ? cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, kAsk, &got, r.data())
                      : cudnnFindConvolutionBackwardDataAlgorithm(h, w_, y_, conv_, x_, kAsk, &got, r.data()),
                  what);
    found = candidates(r, got, det, fp32, what);
  } else {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(kAsk);
    search_status(det ? cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, kAsk, &got, r.data())
                      : cudnnFindConvolutionBackwardFilterAlgorithm(h, x_, y_, conv_, w_, kAsk, &got, r.data()),
                  what);
    found = candidates(r, got, det, fp32, what);
  }
  clear_nonsticky_error();  // an allocation the search tried and gave up on
  // Each candidate is confirmed by cuDNN's workspace query at the math type it will run with
  // before it is taken. A search result's workspace is that of its own math type, and fp32
  // always runs with FMA math: a default-math result that does not run with FMA math, or needs
  // more workspace than the limit with it, gives way to the next. A deterministic choice comes
  // from the heuristics, which predict rather than run: a pick cuDNN then refuses to run gives
  // way to the next too, where taking it would fail the first step.
  std::optional<CudnnAlgoChoice> chosen;
  int not_run = 0, over_limit = 0;  // candidates passed over, and why
  for (CudnnAlgoChoice c : found) {
    const auto runs_with = fp32 ? CUDNN_FMA_MATH : static_cast<cudnnMathType_t>(c.math_type);
    const std::optional<size_t> need = algo_workspace(dir, c.algo, runs_with);
    if (!need) {
      ++not_run;
      continue;
    }
    if (*need > kMaxAlgoWorkspace) {
      ++over_limit;
      continue;
    }
    c.workspace = std::max(c.workspace, *need);
    chosen = c;
    break;
  }
  RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math_));  // the search may have changed it
  if (!chosen)
    RN_UNSUPPORTED() << "cuda backend: cuDNN has no usable algorithm for " << what
                     << (det ? " (deterministic algorithms only: high_precision mode or run.deterministic)" : "")
                     << (fp32 ? " (fp32: FMA math only, no TF32)" : "")
                     << (not_run ? "; cuDNN does not run " + std::to_string(not_run) +
                                       (fp32 ? " with FMA math" : " with its math type")
                                 : "")
                     << (over_limit ? "; " + std::to_string(over_limit) + " need over the " +
                                          std::to_string(kMaxAlgoWorkspace >> 20) + " MiB workspace limit with it"
                                    : "");
  ctx_->algo_cache().put(k, *chosen);
  RN_LOG_DEBUG("cuda backend: {}: algorithm {} (math {}, workspace {} bytes)", what, chosen->algo, chosen->math_type,
               chosen->workspace);
  return *chosen;
}

// Why a cached choice cannot run as it is, or "" if it can: an algorithm outside cuDNN's
// list for the direction, a math type cuDNN does not define, an algorithm cuDNN does not run
// for this convolution (at the math type it would run with), or less workspace than it needs.
std::string CudnnConv::unusable(Direction dir, const CudnnAlgoChoice& c) const {
  const int count = dir == Direction::forward         ? static_cast<int>(CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
                    : dir == Direction::backward_data ? static_cast<int>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
                                                      : static_cast<int>(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  std::ostringstream why;
  if (c.algo < 0 || c.algo >= count) {
    why << "algorithm " << c.algo << " is not one of cuDNN's " << count << " " << direction_name(dir) << " algorithms";
    return why.str();
  }
  const auto m = static_cast<cudnnMathType_t>(c.math_type);
  if (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
      m != CUDNN_FMA_MATH) {
    why << "math type " << c.math_type << " is not one cuDNN defines";
    return why.str();
  }
  const cudnnMathType_t runs_with = math_ == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : m;  // as set_math
  const std::optional<size_t> need = algo_workspace(dir, c.algo, runs_with);
  RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math_));
  if (!need)
    why << "cuDNN does not run algorithm " << c.algo << " with math type " << static_cast<int>(runs_with) << " for "
        << desc_.str();
  else if (*need > c.workspace)
    why << "its workspace of " << c.workspace << " bytes is less than the " << *need << " bytes algorithm " << c.algo
        << " needs";
  return why.str();
}

// The workspace of `algo` with `math`; nothing if cuDNN does not run it so. Leaves the
// descriptor at `math`.
std::optional<size_t> CudnnConv::algo_workspace(Direction dir, int algo, cudnnMathType_t math) const {
  RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math));
  cudnnHandle_t h = ctx_->cudnn();
  size_t bytes = 0;
  cudnnStatus_t st;
  if (dir == Direction::forward)
    st = cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                                 &bytes);
  else if (dir == Direction::backward_data)
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes);
  else
    st = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes);
  if (cudnn_not_supported(st)) return std::nullopt;
  RN_CUDNN_CHECK(st);
  return bytes;
}

void* CudnnConv::weights_krsc(const Tensor& w) const {
  const Conv2dParams& p = desc_.p;
  launch_kcrs_to_krsc(scratch(), w.data, desc_.dtype, p.out_channels, p.in_channels / p.groups, p.kernel_h, p.kernel_w,
                      ctx_->stream());
  return scratch();
}

void CudnnConv::do_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b) {
  void* wk = weights_krsc(w);
  const float one = 1.0f, zero = 0.0f;
  set_math(fwd_.math_type);
  RN_CUDNN_CHECK(cudnnConvolutionForward(ctx_->cudnn(), &one, x_, x.data, w_, wk, conv_,
                                         static_cast<cudnnConvolutionFwdAlgo_t>(fwd_.algo), scratch() + algo_ws_at_,
                                         fwd_.workspace, &zero, y_, y.data));
  if (b) {
    const int64_t M = desc_.batch * desc_.out_h() * desc_.out_w();
    launch_bias_add(y.data, b->ptr<float>(), desc_.dtype, M, desc_.p.out_channels, ctx_->stream());
  }
}

void CudnnConv::do_backward_data(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  void* wk = weights_krsc(w);
  const float one = 1.0f, zero = 0.0f;
  set_math(bwd_data_.math_type);
  RN_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx_->cudnn(), &one, w_, wk, y_, dy.data, conv_,
                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(bwd_data_.algo),
                                              scratch() + algo_ws_at_, bwd_data_.workspace, &zero, x_, dx.data));
}

void CudnnConv::do_backward_weights(const Tensor& dw, const Tensor* db, const Tensor& dy, const Tensor& x) {
  const Conv2dParams& p = desc_.p;
  const float one = 1.0f, zero = 0.0f;
  void* dwk = scratch() + dw_at_;
  set_math(bwd_filter_.math_type);
  RN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx_->cudnn(), &one, x_, x.data, y_, dy.data, conv_,
                                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(bwd_filter_.algo),
                                                scratch() + algo_ws_at_, bwd_filter_.workspace, &zero, w_, dwk));
  launch_accumulate_krsc_to_kcrs(dw.ptr<float>(), dwk, desc_.dtype, p.out_channels, p.in_channels / p.groups,
                                 p.kernel_h, p.kernel_w, ctx_->stream());
  if (db) {
    const int64_t M = desc_.batch * desc_.out_h() * desc_.out_w();
    launch_bias_grad(db->ptr<float>(), dy.data, desc_.dtype, M, p.out_channels,
                     reinterpret_cast<float*>(scratch() + bias_at_), ctx_->stream());
  }
}

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(const ContextPtr& ctx, const Conv2dDesc& d) {
  d.validate();
  require_nhwc(d.layout, d.str());
  if (d.f32_y || d.f32_dx)  // the plan asks only where Backend::conv_f32_outputs() says yes
    RN_UNSUPPORTED() << "conv2d " << d.str()
                     << ": cuDNN's legacy convolutions take one data type for x, y and their gradients";
  // cuDNN's convolutions (the legacy API's int dimensions and strides) address at most
  // 2^31 - 1 elements per tensor; PyTorch splits such batches. Refused here, naming the
  // largest batch that fits, rather than left to cuDNN's BAD_PARAM or worse.
  const int64_t per_sample = std::max(d.x_shape().numel(), d.y_shape().numel()) / std::max<int64_t>(d.batch, 1);
  if (d.batch > kCudnnMaxTensorElements / per_sample)
    RN_UNSUPPORTED() << "conv2d " << d.str() << ": a tensor of " << d.batch * per_sample
                     << " elements, beyond the 2^31 - 1 that cuDNN's convolutions address: at most batch "
                     << kCudnnMaxTensorElements / per_sample << " for this layer";
  return std::make_unique<CudnnConv>(ctx, d);
}

}  // namespace rn::cuda

// The cuDNN convolutions and the cuBLAS GEMM our backend calls (conv2d.cpp, linear.cpp), as
// plain loops for the CPU emulation (sim.h). They are not cuDNN or cuBLAS: they read the same
// descriptors and arguments as the documented APIs define them and compute the result in
// double, so the emulation checks how we call the libraries (layouts, shapes, groups,
// strides, leading dimensions, transposes, where the workspace parts go) and everything
// around the calls, never the libraries themselves. What cuDNN would refuse, they refuse:
// another layout than NHWC activations with KRSC filters, descriptors that do not describe
// one convolution, a compute type other than fp32, a workspace smaller than the algorithm's.
#include <cublas_v2.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "backends/cuda/sim/handles.h"
#include "backends/cuda/sim/sim.h"
#include "core/dtype.h"

struct cudnnTensorStruct {
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  bool set = false;
};
struct cudnnFilterStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, r = 0, s = 0;
  bool set = false;
};
struct cudnnConvolutionStruct {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, groups = 1;
  cudnnConvolutionMode_t mode = CUDNN_CONVOLUTION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  bool set = false;
};

namespace {

bool to_dtype(cudnnDataType_t t, rn::DType* out) {
  switch (t) {
    case CUDNN_DATA_FLOAT: *out = rn::DType::f32; return true;
    case CUDNN_DATA_HALF: *out = rn::DType::f16; return true;
    case CUDNN_DATA_BFLOAT16: *out = rn::DType::bf16; return true;
    default: return false;
  }
}

bool to_dtype(cudaDataType_t t, rn::DType* out) {
  switch (t) {
    case CUDA_R_32F: *out = rn::DType::f32; return true;
    case CUDA_R_16F: *out = rn::DType::f16; return true;
    case CUDA_R_16BF: *out = rn::DType::bf16; return true;
    default: return false;
  }
}

std::vector<double> load(const void* p, rn::DType t, size_t n) {
  std::vector<float> f(n);
  rn::convert(f.data(), rn::DType::f32, p, t, n);
  return std::vector<double>(f.begin(), f.end());
}

// out = alpha * acc + beta * out (beta 0: out is not read, as the libraries define it).
void store(void* p, rn::DType t, const std::vector<double>& acc, double alpha, double beta) {
  std::vector<float> f(acc.size());
  if (beta != 0.0) rn::convert(f.data(), rn::DType::f32, p, t, acc.size());
  for (size_t i = 0; i < acc.size(); ++i)
    f[i] = static_cast<float>(alpha * acc[i] + (beta != 0.0 ? beta * f[i] : 0.0));
  rn::convert(p, t, f.data(), rn::DType::f32, acc.size());
}

// One convolution as the descriptors describe it, or why not. A copy of the convolution
// descriptor: captured work keeps the parameters of its capture, as a graph node does.
struct Conv {
  int N, C, H, W, K, P, Q, R, S, Cg, Kg;
  cudnnConvolutionStruct cd;
  rn::DType type;
};

cudnnStatus_t describe(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* cd,
                       const cudnnTensorStruct* y, Conv* out) {
  if (!x || !w || !cd || !y || !x->set || !w->set || !cd->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->format != CUDNN_TENSOR_NHWC || y->format != CUDNN_TENSOR_NHWC || w->format != CUDNN_TENSOR_NHWC)
    return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;  // what our backend uses; the emulation runs nothing else
  if (x->type != y->type || x->type != w->type || cd->compute != CUDNN_DATA_FLOAT) return CUDNN_STATUS_BAD_PARAM;
  if (cd->mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;
  Conv c{x->n, x->c, x->h, x->w, w->k, y->h, y->w, w->r, w->s, w->c, 0, *cd, rn::DType::f32};
  if (!to_dtype(x->type, &c.type)) return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
  if (cd->groups < 1 || c.C != c.Cg * cd->groups || c.K % cd->groups != 0) return CUDNN_STATUS_BAD_PARAM;
  c.Kg = c.K / cd->groups;
  const int span_h = c.H + 2 * cd->pad_h - cd->dil_h * (c.R - 1) - 1;
  const int span_w = c.W + 2 * cd->pad_w - cd->dil_w * (c.S - 1) - 1;
  if (span_h < 0 || span_w < 0) return CUDNN_STATUS_BAD_PARAM;  // the filter does not fit
  const int p = span_h / cd->stride_h + 1, q = span_w / cd->stride_w + 1;
  if (y->n != c.N || y->c != c.K || p != c.P || q != c.Q) return CUDNN_STATUS_BAD_PARAM;
  *out = c;
  return CUDNN_STATUS_SUCCESS;
}

// f(x index, w index, y index) for every term of the convolution's sum.
template <typename F>
void for_each_term(const Conv& c, F&& f) {
  const cudnnConvolutionStruct& d = c.cd;
  for (int n = 0; n < c.N; ++n)
    for (int p = 0; p < c.P; ++p)
      for (int q = 0; q < c.Q; ++q)
        for (int k = 0; k < c.K; ++k) {
          const int g = k / c.Kg;
          const size_t yi = ((static_cast<size_t>(n) * c.P + p) * c.Q + q) * c.K + k;
          for (int r = 0; r < c.R; ++r) {
            const int h = p * d.stride_h - d.pad_h + r * d.dil_h;
            if (h < 0 || h >= c.H) continue;
            for (int s = 0; s < c.S; ++s) {
              const int w = q * d.stride_w - d.pad_w + s * d.dil_w;
              if (w < 0 || w >= c.W) continue;
              const size_t xrow = ((static_cast<size_t>(n) * c.H + h) * c.W + w) * c.C + static_cast<size_t>(g) * c.Cg;
              const size_t wrow = ((static_cast<size_t>(k) * c.R + r) * c.S + s) * c.Cg;
              for (int cc = 0; cc < c.Cg; ++cc) f(xrow + cc, wrow + cc, yi);
            }
          }
        }
}

size_t x_elems(const Conv& c) { return static_cast<size_t>(c.N) * c.H * c.W * c.C; }
size_t y_elems(const Conv& c) { return static_cast<size_t>(c.N) * c.P * c.Q * c.K; }
size_t w_elems(const Conv& c) { return static_cast<size_t>(c.K) * c.R * c.S * c.Cg; }

// The workspace the emulated algorithms ask for: some, depending on the shape, so that the
// caller must size and place it (conv2d.cpp keeps it beside the KRSC weights in one scratch
// block); each call scribbles over all of it first, so a workspace that overlaps another part
// of the scratch corrupts that part and the result.
size_t workspace_bytes(const Conv& c) { return 256 + 4 * w_elems(c); }

// What the emulated search reports, fastest first, as cuDNN's does: for the backward
// directions a non-deterministic algorithm ahead of a deterministic one (cuDNN's ALGO_0 is
// non-deterministic in both), and last an algorithm that does not apply to the shape with
// one of cuDNN 9's finer "not supported" codes. For fp32 data, where the search reports
// default math (results()), the fastest forward algorithm does not run with FMA math at all
// and the fastest backward-filter one asks for more workspace with FMA math than the backend
// allows (kHugeWorkspace): the backend must then take the next; and the deterministic
// backward-data one is reported with FMA math, which the backend prefers to a faster
// default-math result. The successful ones compute the same sums here; which one the backend takes
// shows in the algorithm cache. cuDNN's heuristics are a prediction, not a run: for half data
// they put first a forward algorithm that the workspace query, the measured search and the
// convolution itself refuse (`heuristic_only`), so the deterministic choice, which comes from
// the heuristics, must confirm its pick before taking it; for fp32 data it is not supported.
enum class WithFma { runs, reported, not_supported, huge_workspace };
constexpr size_t kHugeWorkspace = size_t{2} << 30;
template <typename Algo>
struct Reported {
  Algo algo;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  WithFma fma = WithFma::runs;
  bool heuristic_only = false;
};
constexpr Reported<cudnnConvolutionFwdAlgo_t> kForward[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, WithFma::not_supported,
     true},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, WithFma::not_supported},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, CUDNN_DETERMINISTIC}};
constexpr Reported<cudnnConvolutionBwdDataAlgo_t> kBackwardData[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, WithFma::reported},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, CUDNN_DETERMINISTIC}};
constexpr Reported<cudnnConvolutionBwdFilterAlgo_t> kBackwardFilter[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC, WithFma::huge_workspace},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT,
     CUDNN_DETERMINISTIC}};

template <typename Algo, size_t N>
const Reported<Algo>* reported(const Reported<Algo> (&table)[N], Algo algo) {
  for (const auto& r : table)
    if (r.algo == algo) return &r;
  return nullptr;
}

// Whether `algo` runs with the descriptor's math type (the huge-workspace one is never
// given its workspace with FMA math, so it does not run so either).
template <typename Algo, size_t N>
bool runs(const Reported<Algo> (&table)[N], Algo algo, const cudnnConvolutionStruct* cd) {
  const Reported<Algo>* r = reported(table, algo);
  if (!r || r->status != CUDNN_STATUS_SUCCESS || r->heuristic_only) return false;
  return !cd || cd->math != CUDNN_FMA_MATH || r->fma == WithFma::runs || r->fma == WithFma::reported;
}

// The search's results: the table's first `requested`, with the descriptor's math type, but
// for fp32 data cuDNN's default math (unless the table says FMA), as cuDNN reports an
// algorithm it timed without a math-type variant: whether that runs with FMA math is the
// caller's question (workspace_size). `reversed`: in the opposite order, as a measured search
// may order them on another run (timing noise; $RN_SIM_SEARCH_ORDER=reversed).
template <typename Perf, typename Algo, size_t N>
void results(const Conv& c, const Reported<Algo> (&table)[N], int requested, int* returned, Perf* perf, bool heuristic,
             bool reversed = false) {
  *returned = 0;
  for (size_t i = 0; i < N; ++i) {
    const Reported<Algo>& r = table[reversed ? N - 1 - i : i];
    if (*returned >= requested) break;
    Perf& p = perf[(*returned)++];
    p = Perf{};
    p.algo = r.algo;
    p.status = r.heuristic_only && !(heuristic && c.type != rn::DType::f32) ? CUDNN_STATUS_NOT_SUPPORTED : r.status;
    p.time = p.status == CUDNN_STATUS_SUCCESS ? static_cast<float>(*returned) : -1.0f;
    p.memory = p.status == CUDNN_STATUS_SUCCESS ? workspace_bytes(c) : 0;
    p.determinism = r.determinism;
    p.mathType = c.type != rn::DType::f32   ? c.cd.math
                 : r.fma == WithFma::reported ? CUDNN_FMA_MATH
                                              : CUDNN_DEFAULT_MATH;
  }
}

// The workspace the call was given must hold what the algorithm asked for.
bool workspace_ok(const Conv& c, const void* ws, size_t bytes) { return ws && bytes >= workspace_bytes(c); }
void scribble(const Conv& c, void* ws) { std::memset(ws, 0xA5, workspace_bytes(c)); }

double scalar(const void* p) { return static_cast<double>(*static_cast<const float*>(p)); }

// Queues `op` on the handle's stream, or records it when the stream is captured (sim.h). The
// libraries launch kernels: not into another device's stream (the last error says so).
void queue(cudaStream_t stream, const std::function<void()>& op, const char* what) {
  if (!rn::cuda::sim::launchable(stream, what)) return;
  rn::cuda::sim::submit(stream, op, what);
}

void gemm(bool a_t, bool b_t, int m, int n, int k, double al, const void* A, rn::DType a, int lda, const void* B,
          rn::DType b, int ldb, double be, void* C, rn::DType c, int ldc);

// The algorithm search of every direction, if the descriptors make one convolution. The real
// search allocates its buffers and waits for its timings: refused during a stream capture
// (which it invalidates), as on a GPU.
template <typename Perf, typename Algo, size_t N>
cudnnStatus_t find(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* cd,
                   const cudnnTensorStruct* y, const Reported<Algo> (&table)[N], int requested, int* returned,
                   Perf* perf, const char* what) {
  if (!returned || !perf || requested < 0) return CUDNN_STATUS_BAD_PARAM;
  if (!rn::cuda::sim::allowed_outside_capture(what)) return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
  Conv c;
  if (const cudnnStatus_t st = describe(x, w, cd, y, &c); st != CUDNN_STATUS_SUCCESS) return st;
  const char* order = std::getenv("RN_SIM_SEARCH_ORDER");
  results(c, table, requested, returned, perf, false, order != nullptr && std::string_view(order) == "reversed");
  return CUDNN_STATUS_SUCCESS;
}

// cuDNN's heuristics (the _v7 queries): the same results, in the table's order always (no
// timing), and no allocation, so allowed in a capture.
template <typename Perf, typename Algo, size_t N>
cudnnStatus_t heuristics(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* cd,
                         const cudnnTensorStruct* y, const Reported<Algo> (&table)[N], int requested, int* returned,
                         Perf* perf) {
  if (!returned || !perf || requested < 1) return CUDNN_STATUS_BAD_PARAM;
  Conv c;
  if (const cudnnStatus_t st = describe(x, w, cd, y, &c); st != CUDNN_STATUS_SUCCESS) return st;
  results(c, table, requested, returned, perf, true);
  return CUDNN_STATUS_SUCCESS;
}

// The workspace of one algorithm at the descriptor's math type; an algorithm the search
// does not report as running is not supported.
template <typename Algo, size_t N>
cudnnStatus_t workspace_size(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* cd,
                             const cudnnTensorStruct* y, const Reported<Algo> (&table)[N], Algo algo, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  Conv c;
  if (const cudnnStatus_t st = describe(x, w, cd, y, &c); st != CUDNN_STATUS_SUCCESS) return st;
  const Reported<Algo>* r = reported(table, algo);
  if (!r || r->status != CUDNN_STATUS_SUCCESS || r->heuristic_only) return CUDNN_STATUS_NOT_SUPPORTED;
  const bool fma = c.cd.math == CUDNN_FMA_MATH;
  if (fma && r->fma == WithFma::not_supported) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = fma && r->fma == WithFma::huge_workspace ? kHugeWorkspace : workspace_bytes(c);
  return CUDNN_STATUS_SUCCESS;
}

// One direction of a convolution on the handle's stream: out = alpha * (the sum of the
// terms of `in0` and `in1`) + beta * out, where add(acc, v0, v1, xi, wi, yi) adds one term.
// The call must name the searched algorithm and give its workspace.
template <typename Add>
cudnnStatus_t convolve(cudnnHandle_t h, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                       const cudnnConvolutionStruct* cd, const cudnnTensorStruct* y, bool algo_ok, void* ws,
                       size_t ws_bytes, const void* alpha, const void* beta, const void* in0,
                       size_t (*in0_elems)(const Conv&), const void* in1, size_t (*in1_elems)(const Conv&), void* out,
                       size_t (*out_elems)(const Conv&), Add add, const char* what) {
  Conv c;
  if (const cudnnStatus_t st = describe(x, w, cd, y, &c); st != CUDNN_STATUS_SUCCESS) return st;
  if (!algo_ok || !workspace_ok(c, ws, ws_bytes)) return CUDNN_STATUS_BAD_PARAM;
  const double al = scalar(alpha), be = scalar(beta);  // host scalars: read at the call
  queue(h->stream, [=] {
    scribble(c, ws);
    const std::vector<double> v0 = load(in0, c.type, in0_elems(c)), v1 = load(in1, c.type, in1_elems(c));
    std::vector<double> acc(out_elems(c), 0.0);
    for_each_term(c, [&](size_t xi, size_t wi, size_t yi) { add(acc, v0, v1, xi, wi, yi); });
    store(out, c.type, acc, al, be);
  }, what);
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  *d = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnTensorStruct{format, type, n, c, h, w, true};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  *d = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnFilterStruct{type, format, k, c, h, w, true};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  *d = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0) return CUDNN_STATUS_BAD_PARAM;
  d->pad_h = pad_h, d->pad_w = pad_w, d->stride_h = u, d->stride_w = v, d->dil_h = dilation_h, d->dil_w = dilation_w;
  d->mode = mode;
  d->compute = compute;
  d->set = true;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (groups < 1) return CUDNN_STATUS_BAD_PARAM;
  d->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
  d->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                   const cudnnFilterDescriptor_t w,
                                                   const cudnnConvolutionDescriptor_t cd,
                                                   const cudnnTensorDescriptor_t y, const int requested, int* returned,
                                                   cudnnConvolutionFwdAlgoPerf_t* perf) {
  return find(x, w, cd, y, kForward, requested, returned, perf, "cudnnFindConvolutionForwardAlgorithm");
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                        const cudnnTensorDescriptor_t dy,
                                                        const cudnnConvolutionDescriptor_t cd,
                                                        const cudnnTensorDescriptor_t dx, const int requested,
                                                        int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return find(dx, w, cd, dy, kBackwardData, requested, returned, perf, "cudnnFindConvolutionBackwardDataAlgorithm");
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t cd,
                                                          const cudnnFilterDescriptor_t dw, const int requested,
                                                          int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return find(x, dw, cd, dy, kBackwardFilter, requested, returned, perf,
              "cudnnFindConvolutionBackwardFilterAlgorithm");
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t cd,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  return heuristics(x, w, cd, y, kForward, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t cd,
                                                          const cudnnTensorDescriptor_t dx, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return heuristics(dx, w, cd, dy, kBackwardData, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t cd,
                                                            const cudnnFilterDescriptor_t dw, const int requested,
                                                            int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return heuristics(x, dw, cd, dy, kBackwardFilter, requested, returned, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t cd,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t* bytes) {
  return workspace_size(x, w, cd, y, kForward, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t cd,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  return workspace_size(dx, w, cd, dy, kBackwardData, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t cd,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  return workspace_size(x, dw, cd, dy, kBackwardFilter, algo, bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xd,
                                      const void* x, const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t cd, cudnnConvolutionFwdAlgo_t algo, void* ws,
                                      size_t ws_bytes, const void* beta, const cudnnTensorDescriptor_t yd, void* y) {
  return convolve(h, xd, wd, cd, yd, runs(kForward, algo, cd), ws, ws_bytes, alpha, beta, x,
                  x_elems, w, w_elems, y, y_elems,
                  [](std::vector<double>& acc, const std::vector<double>& xv, const std::vector<double>& wv, size_t xi,
                     size_t wi, size_t yi) { acc[yi] += xv[xi] * wv[wi]; },
                  "cudnnConvolutionForward");
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha, const cudnnFilterDescriptor_t wd,
                                           const void* w, const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdDataAlgo_t algo,
                                           void* ws, size_t ws_bytes, const void* beta, const cudnnTensorDescriptor_t dxd,
                                           void* dx) {
  return convolve(h, dxd, wd, cd, dyd, runs(kBackwardData, algo, cd), ws, ws_bytes, alpha, beta, dy,
                  y_elems, w, w_elems, dx, x_elems,
                  [](std::vector<double>& acc, const std::vector<double>& gv, const std::vector<double>& wv, size_t xi,
                     size_t wi, size_t yi) { acc[xi] += gv[yi] * wv[wi]; },
                  "cudnnConvolutionBackwardData");
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xd,
                                             const void* x, const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t cd,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t ws_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  return convolve(h, xd, dwd, cd, dyd, runs(kBackwardFilter, algo, cd), ws, ws_bytes, alpha, beta, x,
                  x_elems, dy, y_elems, dw, w_elems,
                  [](std::vector<double>& acc, const std::vector<double>& xv, const std::vector<double>& gv, size_t xi,
                     size_t wi, size_t yi) { acc[wi] += xv[xi] * gv[yi]; },
                  "cudnnConvolutionBackwardFilter");
}

// Column-major C(m, n) = alpha op(A)(m, k) op(B)(k, n) + beta C, scalars on the host, fp32
// compute (what linear.cpp asks for; anything else is refused).
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                            cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const bool a_t = ta == CUBLAS_OP_T, b_t = tb == CUBLAS_OP_T;
  if ((ta != CUBLAS_OP_N && !a_t) || (tb != CUBLAS_OP_N && !b_t)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Leading dimensions at least the stored rows, as cuBLAS requires.
  if (lda < (a_t ? k : m) || ldb < (b_t ? n : k) || ldc < m || lda < 1 || ldb < 1 || ldc < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  rn::DType a, b, c;
  if (!to_dtype(at, &a) || !to_dtype(bt, &b) || !to_dtype(ct, &c) || a != b) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const double al = scalar(alpha), be = scalar(beta);
  queue(h->stream, [=] { gemm(ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, al, A, a, lda, B, b, ldb, be, C, c, ldc); },
        "cublasGemmEx");
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace {
void gemm(bool a_t, bool b_t, int m, int n, int k, double al, const void* A, rn::DType a, int lda, const void* B,
          rn::DType b, int ldb, double be, void* C, rn::DType c, int ldc) {
  const size_t a_cols = static_cast<size_t>(a_t ? m : k), b_cols = static_cast<size_t>(b_t ? k : n);
  // Read exactly what the call may read: the last column up to its stored rows (nothing when
  // k == 0: C = beta C).
  const std::vector<double> av = k == 0 ? std::vector<double>() : load(A, a, (a_cols - 1) * lda + (a_t ? k : m));
  const std::vector<double> bv = k == 0 ? std::vector<double>() : load(B, b, (b_cols - 1) * ldb + (b_t ? n : k));
  std::vector<double> acc(static_cast<size_t>(ldc) * (n - 1) + m, 0.0);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0.0;
      for (int l = 0; l < k; ++l) {
        const double x = a_t ? av[static_cast<size_t>(i) * lda + l] : av[static_cast<size_t>(l) * lda + i];
        const double y = b_t ? bv[static_cast<size_t>(l) * ldb + j] : bv[static_cast<size_t>(j) * ldb + l];
        s += x * y;
      }
      acc[static_cast<size_t>(j) * ldc + i] = s;
    }
  // Write column by column: rows beyond m of a column (ldc > m) are not C's.
  for (int j = 0; j < n; ++j) {
    const size_t at_col = static_cast<size_t>(j) * ldc;
    const std::vector<double> col(acc.begin() + static_cast<std::ptrdiff_t>(at_col),
                                  acc.begin() + static_cast<std::ptrdiff_t>(at_col + m));
    store(static_cast<char*>(C) + at_col * rn::dtype_size(c), c, col, al, be);
  }
}
}  // namespace

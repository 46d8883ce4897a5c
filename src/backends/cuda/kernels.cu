// The backend's own kernels. Per-element arithmetic that has a CPU twin comes from
// ops/fused_math.h. Reductions run in fixed orders (no atomics), so every result is the
// same bits on every run: batch norm's recompute (memory level O2) depends on that.
#include <cfloat>

#include "backends/cuda/device_types.cuh"
#include "backends/cuda/kernels.h"
#include "ops/fused_math.h"

namespace rn::cuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride loop over [0, n).
#define RN_FOR_EACH(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

template <typename S, typename D>
__global__ void cast_kernel(D* y, const S* x, int64_t n) {
  RN_FOR_EACH(i, n) y[i] = from_f32<D>(to_f32<S>(x[i]));
}

template <typename T>
__global__ void relu_forward_kernel(T* y, const T* x, int64_t n) {
  RN_FOR_EACH(i, n) y[i] = from_f32<T>(fused::relu(to_f32<T>(x[i])));
}

template <typename T>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, int64_t n) {
  RN_FOR_EACH(i, n) dx[i] = to_f32<T>(y[i]) > 0.0f ? dy[i] : from_f32<T>(0.0f);
}

template <typename T>
__global__ void add_kernel(T* y, const T* a, const T* b, int64_t n) {
  RN_FOR_EACH(i, n) y[i] = from_f32<T>(to_f32<T>(a[i]) + to_f32<T>(b[i]));
}

// ---- per-channel reductions -----------------------------------------------------------
// Grid (ceil(C/32), splits), block (32, 8): thread (tx, ty) sums channel bx*32+tx over
// rows ty, ty+8, ... of its split; the 8 row-threads are combined in order, then the
// splits in order by a finishing kernel (in double).
constexpr int kRowThreads = 8;

struct ReduceShape {
  int64_t splits, rows_per_split;
};
__host__ __device__ inline ReduceShape reduce_shape(int64_t M) {
  int64_t rows = 256;
  while ((M + rows - 1) / rows > 1024) rows *= 2;
  return {(M + rows - 1) / rows, rows};
}

// Op(m, c) -> float2 of the two quantities summed.
template <typename Op>
__global__ void channel_partials_kernel(float* partials, int64_t M, int64_t C, Op op) {
  __shared__ float sa[kRowThreads][32], sb[kRowThreads][32];
  const ReduceShape rs = reduce_shape(M);
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = blockIdx.y * rs.rows_per_split;
  const int64_t end = begin + rs.rows_per_split < M ? begin + rs.rows_per_split : M;
  float a = 0.0f, b = 0.0f;
  if (c < C)
    for (int64_t m = begin + threadIdx.y; m < end; m += kRowThreads) {
      const float2 v = op(m, c);
      a += v.x;
      b += v.y;
    }
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int r = 1; r < kRowThreads; ++r) a += sa[r][threadIdx.x], b += sb[r][threadIdx.x];
    partials[(blockIdx.y * C + c) * 2] = a;
    partials[(blockIdx.y * C + c) * 2 + 1] = b;
  }
}

template <typename Op>
void run_channel_partials(float* partials, int64_t M, int64_t C, Op op, cudaStream_t s) {
  const ReduceShape rs = reduce_shape(M);
  dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(rs.splits));
  channel_partials_kernel<<<grid, dim3(32, kRowThreads), 0, s>>>(partials, M, C, op);
  RN_CUDA_LAUNCH_CHECK();
}

// sums[c] (double, fixed order) of the first quantity (which == 0) or the second.
__device__ inline double sum_partials(const float* partials, int64_t splits, int64_t C, int64_t c, int which) {
  double t = 0.0;
  for (int64_t k = 0; k < splits; ++k) t += partials[(k * C + c) * 2 + which];
  return t;
}

template <typename T>
struct SumX {
  const T* x;
  int64_t C;
  __device__ float2 operator()(int64_t m, int64_t c) const { return make_float2(to_f32<T>(x[m * C + c]), 0.0f); }
};

template <typename T>
struct SumSquaredDeviation {
  const T* x;
  const float* mean;
  int64_t C;
  __device__ float2 operator()(int64_t m, int64_t c) const {
    const float d = to_f32<T>(x[m * C + c]) - mean[c];
    return make_float2(d * d, 0.0f);
  }
};

template <typename T>
struct SumDyAndDyXhat {
  const T* dy;
  const T* x;
  const float *mean, *invstd;
  int64_t C;
  __device__ float2 operator()(int64_t m, int64_t c) const {
    const float g = to_f32<T>(dy[m * C + c]);
    const float xhat = (to_f32<T>(x[m * C + c]) - mean[c]) * invstd[c];
    return make_float2(g, g * xhat);
  }
};

__global__ void finish_mean_kernel(float* mean, const float* partials, int64_t splits, int64_t M, int64_t C) {
  RN_FOR_EACH(c, C) mean[c] = static_cast<float>(sum_partials(partials, splits, C, c, 0) / static_cast<double>(M));
}

__global__ void finish_two_sums_kernel(float* a, float* b, const float* partials, int64_t splits, int64_t C,
                                       double scale, bool accumulate) {
  RN_FOR_EACH(c, C) {
    const float va = static_cast<float>(sum_partials(partials, splits, C, c, 0) * scale);
    if (a) a[c] = accumulate ? a[c] + va : va;
    if (b) b[c] = static_cast<float>(sum_partials(partials, splits, C, c, 1) * scale);
  }
}

__global__ void bn_finish_training_kernel(float* saved_mean, float* saved_invstd, float* rmean, float* rvar,
                                          const float* mean, const float* var, float eps, float momentum, int64_t M,
                                          int64_t C) {
  RN_FOR_EACH(c, C) {
    saved_mean[c] = mean[c];
    saved_invstd[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(var[c]) + eps));
    fused::bn_running_update(rmean[c], rvar[c], mean[c], var[c], momentum, M);
  }
}

__global__ void bn_compare_kernel(int* mismatch, const float* mean, const float* var, const float* saved_mean,
                                  const float* saved_invstd, float eps, int64_t C) {
  RN_FOR_EACH(c, C) {
    const float invstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var[c]) + eps));
    if (__float_as_uint(mean[c]) != __float_as_uint(saved_mean[c]) ||
        __float_as_uint(invstd) != __float_as_uint(saved_invstd[c]))
      *mismatch = 1;
  }
}

// The channel of flat NHWC index i. A 64-bit remainder is a long instruction sequence on the
// GPU, enough to make these memory-bound kernels compute-bound; below 2^32 elements (every
// ResNet-50 activation at batch 256) a 32-bit one does.
template <bool kSmall>
__device__ __forceinline__ int64_t channel_of(int64_t i, int64_t C) {
  if constexpr (kSmall) return static_cast<int64_t>(static_cast<uint32_t>(i) % static_cast<uint32_t>(C));
  return i % C;
}
inline bool fits_32(int64_t n) { return n < (int64_t{1} << 32); }

template <typename T, bool kSmall>
__global__ void bn_apply_kernel(T* y, const T* x, const T* residual, int64_t n, int64_t C, const float* mean,
                                const float* var_or_invstd, bool is_var, float eps, const float* gamma,
                                const float* beta, int fuse) {
  RN_FOR_EACH(i, n) {
    const int64_t c = channel_of<kSmall>(i, C);
    const float invstd = is_var ? 1.0f / sqrtf(var_or_invstd[c] + eps) : var_or_invstd[c];
    float v = fused::bn_apply(to_f32<T>(x[i]), mean[c], invstd, gamma[c], beta[c]);
    if (fuse == 2) {
      // Rounded to the storage type first, as an unfused BN then add would.
      v = to_f32<T>(from_f32<T>(v)) + to_f32<T>(residual[i]);
    }
    if (fuse != 0) v = fused::relu(v);
    y[i] = from_f32<T>(v);
  }
}

template <typename T, bool kSmall>
__global__ void bn_backward_dx_kernel(T* dx, const T* dy, const T* x, int64_t n, int64_t C, float inv_m,
                                      const float* mean, const float* invstd, const float* gamma, const float* sum_dy,
                                      const float* sum_dy_xhat) {
  RN_FOR_EACH(i, n) {
    const int64_t c = channel_of<kSmall>(i, C);
    dx[i] = from_f32<T>(fused::bn_backward_dx(to_f32<T>(dy[i]), to_f32<T>(x[i]), mean[c], invstd[c], gamma[c],
                                              sum_dy[c], sum_dy_xhat[c], inv_m));
  }
}

__global__ void accumulate_stats_kernel(float* dgamma, float* dbeta, const float* sum_dy, const float* sum_dy_xhat,
                                        int64_t C) {
  RN_FOR_EACH(c, C) {
    dgamma[c] += sum_dy_xhat[c];
    dbeta[c] += sum_dy[c];
  }
}

template <typename T>
__global__ void bias_add_kernel(T* y, const float* b, int64_t n, int64_t C) {
  RN_FOR_EACH(i, n) y[i] = from_f32<T>(to_f32<T>(y[i]) + b[i % C]);
}

template <typename T>
__global__ void kcrs_to_krsc_kernel(T* dst, const T* src, int64_t K, int64_t C, int64_t R, int64_t S) {
  const int64_t n = K * C * R * S;
  RN_FOR_EACH(i, n) {  // i indexes the destination KRSC
    const int64_t c = i % C, s = (i / C) % S, r = (i / (C * S)) % R, k = i / (C * S * R);
    dst[i] = src[((k * C + c) * R + r) * S + s];
  }
}

template <typename T>
__global__ void accumulate_krsc_to_kcrs_kernel(float* dst, const T* src, int64_t K, int64_t C, int64_t R, int64_t S) {
  const int64_t n = K * C * R * S;
  RN_FOR_EACH(i, n) {  // i indexes the destination KCRS
    const int64_t s = i % S, r = (i / S) % R, c = (i / (S * R)) % C, k = i / (S * R * C);
    dst[i] += to_f32<T>(src[((k * R + r) * S + s) * C + c]);
  }
}

template <typename T>
__global__ void accumulate_kernel(float* dst, const T* src, int64_t n) {
  RN_FOR_EACH(i, n) dst[i] += to_f32<T>(src[i]);
}

// ---- pooling ------------------------------------------------------------------------------
template <typename T>
__global__ void max_pool_forward_kernel(T* y, int32_t* argmax, const T* x, int64_t N, int64_t C, int64_t H, int64_t W,
                                        int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad) {
  const int64_t n_out = N * P * Q * C;
  RN_FOR_EACH(i, n_out) {
    const int64_t c = i % C, q = (i / C) % Q, p = (i / (C * Q)) % P, n = i / (C * Q * P);
    float best = -FLT_MAX;
    int32_t at = -1;
    for (int64_t r = 0; r < k; ++r) {
      const int64_t h = p * stride - pad + r;
      if (h < 0 || h >= H) continue;
      for (int64_t s = 0; s < k; ++s) {
        const int64_t w = q * stride - pad + s;
        if (w < 0 || w >= W) continue;
        const float v = to_f32<T>(x[((n * H + h) * W + w) * C + c]);
        if (at < 0 || v > best || v != v) best = v, at = static_cast<int32_t>(h * W + w);
      }
    }
    y[i] = from_f32<T>(best);
    argmax[i] = at;
  }
}

// Gathers, for each input element, the gradients of the outputs whose maximum it was.
template <typename T>
__global__ void max_pool_backward_kernel(T* dx, const T* dy, const int32_t* argmax, int64_t N, int64_t C, int64_t H,
                                         int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad) {
  const int64_t n_in = N * H * W * C;
  RN_FOR_EACH(i, n_in) {
    const int64_t c = i % C, w = (i / C) % W, h = (i / (C * W)) % H, n = i / (C * W * H);
    const int32_t me = static_cast<int32_t>(h * W + w);
    // Outputs p with p*stride - pad <= h <= p*stride - pad + k - 1.
    const int64_t p0 = max(int64_t{0}, (h + pad - k + stride) / stride), p1 = min(P - 1, (h + pad) / stride);
    const int64_t q0 = max(int64_t{0}, (w + pad - k + stride) / stride), q1 = min(Q - 1, (w + pad) / stride);
    float g = 0.0f;
    for (int64_t p = p0; p <= p1; ++p)
      for (int64_t q = q0; q <= q1; ++q) {
        const int64_t o = ((n * P + p) * Q + q) * C + c;
        if (argmax[o] == me) g += to_f32<T>(dy[o]);
      }
    dx[i] = from_f32<T>(g);
  }
}

template <typename T>
__global__ void gap_forward_kernel(T* y, const T* x, int64_t N, int64_t C, int64_t HW) {
  RN_FOR_EACH(i, N * C) {
    const int64_t c = i % C, n = i / C;
    float s = 0.0f;
    for (int64_t p = 0; p < HW; ++p) s += to_f32<T>(x[(n * HW + p) * C + c]);
    y[i] = from_f32<T>(s / static_cast<float>(HW));
  }
}

template <typename T>
__global__ void gap_backward_kernel(T* dx, const T* dy, int64_t N, int64_t C, int64_t HW) {
  RN_FOR_EACH(i, N * HW * C) {
    const int64_t c = i % C, n = i / (HW * C);
    dx[i] = from_f32<T>(to_f32<T>(dy[n * C + c]) / static_cast<float>(HW));
  }
}

// ---- loss -----------------------------------------------------------------------------------
// Block-wide reductions in a fixed order (shared-memory tree).
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float o = shared[threadIdx.x + stride];
      shared[threadIdx.x] = kMax ? fmaxf(shared[threadIdx.x], o) : shared[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = shared[0];
  __syncthreads();
  return r;
}

// One block per sample.
__global__ void softmax_ce_forward_kernel(float* probs, float* per_sample, const float* logits, const int32_t* labels,
                                          int64_t K, float smoothing, int* bad_label) {
  __shared__ float shared[kThreads];
  const int64_t n = blockIdx.x;
  const float* z = logits + n * K;
  float m = -FLT_MAX;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, z[k]);
  m = block_reduce<true>(m, shared);
  float se = 0.0f, sz = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) se += expf(z[k] - m), sz += z[k];
  se = block_reduce<false>(se, shared);
  sz = block_reduce<false>(sz, shared);
  const float lse = m + logf(se);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) probs[n * K + k] = expf(z[k] - lse);
  if (threadIdx.x == 0) {
    const int32_t label = labels[n];
    if (label < 0 || label >= K) {
      atomicCAS(bad_label, 0, static_cast<int>(n) + 1);
      per_sample[n] = __int_as_float(0x7fc00000);
    } else {
      // -sum_k t_k log p_k with t = (1-eps) onehot + eps/K
      per_sample[n] = lse - (1.0f - smoothing) * z[label] - smoothing / static_cast<float>(K) * sz;
    }
  }
}

__global__ void mean_kernel(float* out, const float* v, int64_t n) {
  __shared__ float shared[kThreads];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_reduce<false>(s, shared);
  if (threadIdx.x == 0) out[0] = s / static_cast<float>(n);
}

__global__ void softmax_ce_backward_kernel(float* dlogits, const float* probs, const int32_t* labels, int64_t N,
                                           int64_t K, float smoothing, float grad_scale, const float* scale_source) {
  const float scale = scale_source ? grad_scale * *scale_source : grad_scale;
  RN_FOR_EACH(i, N * K) {
    const int64_t n = i / K, k = i % K;
    dlogits[i] = fused::softmax_ce_grad(probs[i], labels[n] == k, smoothing, K, scale, N);
  }
}

}  // namespace

// ---- launchers --------------------------------------------------------------------------------

void launch_cast(void* y, DType dst, const void* x, DType src, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(src, S, RN_DISPATCH_FLOAT(dst, D, {
                      cast_kernel<S, D><<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<D*>(y),
                                                                                     static_cast<const S*>(x), n);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_relu_forward(void* y, const void* x, DType t, int64_t n, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    relu_forward_kernel<T>
        <<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), n);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_relu_backward(void* dx, const void* dy, const void* y, DType t, int64_t n, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    relu_backward_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(dx), static_cast<const T*>(dy),
                                                                         static_cast<const T*>(y), n);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_add(void* y, const void* a, const void* b, DType t, int64_t n, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    add_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(a),
                                                               static_cast<const T*>(b), n);
    RN_CUDA_LAUNCH_CHECK();
  });
}

int64_t channel_partials_floats(int64_t M, int64_t C) { return reduce_shape(M).splits * C * 2; }

void launch_bn_stats(float* mean, float* var, const void* x, DType t, int64_t M, int64_t C, float* partials,
                     cudaStream_t s) {
  const int64_t splits = reduce_shape(M).splits;
  const unsigned cb = blocks_for(C, kThreads);
  RN_DISPATCH_FLOAT(t, T, {
    const T* xt = static_cast<const T*>(x);
    run_channel_partials(partials, M, C, SumX<T>{xt, C}, s);
    finish_mean_kernel<<<cb, kThreads, 0, s>>>(mean, partials, splits, M, C);
    RN_CUDA_LAUNCH_CHECK();
    // Two passes (mean, then squared deviations): no cancellation when |mean| >> std.
    run_channel_partials(partials, M, C, SumSquaredDeviation<T>{xt, mean, C}, s);
    finish_two_sums_kernel<<<cb, kThreads, 0, s>>>(var, nullptr, partials, splits, C, 1.0 / static_cast<double>(M),
                                                   false);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bn_finish_training(float* saved_mean, float* saved_invstd, float* running_mean, float* running_var,
                               const float* mean, const float* var, float eps, float momentum, int64_t M, int64_t C,
                               cudaStream_t s) {
  bn_finish_training_kernel<<<blocks_for(C, kThreads), kThreads, 0, s>>>(saved_mean, saved_invstd, running_mean,
                                                                         running_var, mean, var, eps, momentum, M, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_compare(int* mismatch, const float* mean, const float* var, const float* saved_mean,
                       const float* saved_invstd, float eps, int64_t C, cudaStream_t s) {
  bn_compare_kernel<<<blocks_for(C, kThreads), kThreads, 0, s>>>(mismatch, mean, var, saved_mean, saved_invstd, eps, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_apply(void* y, const void* x, const void* residual, DType t, int64_t M, int64_t C, const float* mean,
                     const float* var_or_invstd, bool is_var, float eps, const float* gamma, const float* beta,
                     int fuse, cudaStream_t s) {
  const int64_t n = M * C;
  RN_DISPATCH_FLOAT(t, T, {
    auto kernel = fits_32(n) ? bn_apply_kernel<T, true> : bn_apply_kernel<T, false>;
    kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x),
                                                        static_cast<const T*>(residual), n, C, mean, var_or_invstd,
                                                        is_var, eps, gamma, beta, fuse);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bn_backward_sums(float* sum_dy, float* sum_dy_xhat, const void* dy, const void* x, DType t, int64_t M,
                             int64_t C, const float* mean, const float* invstd, float* partials, cudaStream_t s) {
  const int64_t splits = reduce_shape(M).splits;
  RN_DISPATCH_FLOAT(t, T, {
    run_channel_partials(partials, M, C,
                         SumDyAndDyXhat<T>{static_cast<const T*>(dy), static_cast<const T*>(x), mean, invstd, C}, s);
    finish_two_sums_kernel<<<blocks_for(C, kThreads), kThreads, 0, s>>>(sum_dy, sum_dy_xhat, partials, splits, C, 1.0,
                                                                        false);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bn_backward_dx(void* dx, const void* dy, const void* x, DType t, int64_t M, int64_t C, const float* mean,
                           const float* invstd, const float* gamma, const float* sum_dy, const float* sum_dy_xhat,
                           float* dgamma, float* dbeta, cudaStream_t s) {
  const int64_t n = M * C;
  RN_DISPATCH_FLOAT(t, T, {
    auto kernel = fits_32(n) ? bn_backward_dx_kernel<T, true> : bn_backward_dx_kernel<T, false>;
    kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), n, C,
        static_cast<float>(1.0 / static_cast<double>(M)), mean, invstd, gamma, sum_dy, sum_dy_xhat);
    RN_CUDA_LAUNCH_CHECK();
  });
  accumulate_stats_kernel<<<blocks_for(C, kThreads), kThreads, 0, s>>>(dgamma, dbeta, sum_dy, sum_dy_xhat, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bias_add(void* y, const float* b, DType t, int64_t M, int64_t C, cudaStream_t s) {
  const int64_t n = M * C;
  RN_DISPATCH_FLOAT(t, T, {
    bias_add_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), b, n, C);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bias_grad(float* db, const void* dy, DType t, int64_t M, int64_t C, float* partials, cudaStream_t s) {
  const int64_t splits = reduce_shape(M).splits;
  RN_DISPATCH_FLOAT(t, T, {
    run_channel_partials(partials, M, C, SumX<T>{static_cast<const T*>(dy), C}, s);
    finish_two_sums_kernel<<<blocks_for(C, kThreads), kThreads, 0, s>>>(db, nullptr, partials, splits, C, 1.0, true);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_kcrs_to_krsc(void* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                         cudaStream_t s) {
  const int64_t n = K * C * R * S;
  RN_DISPATCH_FLOAT(t, T, {
    kcrs_to_krsc_kernel<T>
        <<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(src), K, C, R, S);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_accumulate_krsc_to_kcrs(float* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                                    cudaStream_t s) {
  const int64_t n = K * C * R * S;
  RN_DISPATCH_FLOAT(t, T, {
    accumulate_krsc_to_kcrs_kernel<T>
        <<<blocks_for(n, kThreads), kThreads, 0, s>>>(dst, static_cast<const T*>(src), K, C, R, S);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_accumulate(float* dst, const void* src, DType t, int64_t n, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    accumulate_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(dst, static_cast<const T*>(src), n);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_max_pool_forward(void* y, int32_t* argmax, const void* x, DType t, int64_t N, int64_t C, int64_t H,
                             int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    max_pool_forward_kernel<T><<<blocks_for(N * P * Q * C, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), argmax, static_cast<const T*>(x), N, C, H, W, P, Q, k, stride, pad);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_max_pool_backward(void* dx, const void* dy, const int32_t* argmax, DType t, int64_t N, int64_t C, int64_t H,
                              int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    max_pool_backward_kernel<T><<<blocks_for(N * H * W * C, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), argmax, N, C, H, W, P, Q, k, stride, pad);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_global_avg_pool_forward(void* y, const void* x, DType t, int64_t N, int64_t C, int64_t HW, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    gap_forward_kernel<T>
        <<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), N, C, HW);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_global_avg_pool_backward(void* dx, const void* dy, DType t, int64_t N, int64_t C, int64_t HW,
                                     cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    gap_backward_kernel<T><<<blocks_for(N * HW * C, kThreads), kThreads, 0, s>>>(static_cast<T*>(dx),
                                                                                 static_cast<const T*>(dy), N, C, HW);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_softmax_ce_forward(float* loss, float* probs, float* per_sample, const float* logits, const int32_t* labels,
                               int64_t N, int64_t K, float smoothing, int* bad_label, cudaStream_t s) {
  softmax_ce_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(probs, per_sample, logits, labels, K,
                                                                          smoothing, bad_label);
  RN_CUDA_LAUNCH_CHECK();
  mean_kernel<<<1, kThreads, 0, s>>>(loss, per_sample, N);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_softmax_ce_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t N, int64_t K,
                                float smoothing, float grad_scale, const float* scale_source, cudaStream_t s) {
  softmax_ce_backward_kernel<<<blocks_for(N * K, kThreads), kThreads, 0, s>>>(dlogits, probs, labels, N, K, smoothing,
                                                                              grad_scale, scale_source);
  RN_CUDA_LAUNCH_CHECK();
}

}  // namespace rn::cuda

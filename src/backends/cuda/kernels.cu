// The backend's own kernels. Per-element arithmetic that has a CPU twin comes from
// ops/fused_math.h. Reductions run in fixed orders (no atomics), so every result is the
// same bits on every run: batch norm's recompute (memory level O2) depends on that.
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <type_traits>

#include "backends/cuda/device_types.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tiling.h"
#include "ops/fused_math.h"

namespace rn::cuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride loop over [0, n).
#define RN_FOR_EACH(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- vectors ------------------------------------------------------------------------------
// V elements loaded or stored in one access when the address allows it (tiling.h chooses V).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, bool aligned = true) {
  if (aligned) {
    RN_SIM_CHECK_ALIGNED(p, sizeof(Pack<T, V>));
    return *reinterpret_cast<const Pack<T, V>*>(p);
  }
  Pack<T, V> r;
#pragma unroll
  for (int k = 0; k < V; ++k) r.v[k] = p[k];
  return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& r, bool aligned = true) {
  if (aligned) {
    RN_SIM_CHECK_ALIGNED(p, sizeof(Pack<T, V>));
    *reinterpret_cast<Pack<T, V>*>(p) = r;
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) p[k] = r.v[k];
}

// Flat kernels: f.operator()<V>(i) handles elements [i, i + V) for the whole vectors of
// [0, n), then f.operator()<1>(i) the tail. The per-element arithmetic is the same for every
// V, so the vector width never changes a result.
template <int V, typename F>
__device__ __forceinline__ void flat_loop(int64_t n, const F& f) {
  const int64_t nv = n / V;
  RN_FOR_EACH(j, nv) f.template operator()<V>(j * V);
  if constexpr (V > 1) {
    const int64_t done = nv * V;
    RN_FOR_EACH(i, n - done) f.template operator()<1>(done + i);
  }
}

template <typename S, typename D, int V>
__global__ void cast_kernel(D* y, const S* x, int64_t n) {
  flat_loop<V>(n, [&]<int W>(int64_t i) {
    const Pack<S, W> in = load_pack<S, W>(x + i);
    Pack<D, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = from_f32<D>(to_f32<S>(in.v[k]));
    store_pack<D, W>(y + i, out);
  });
}

template <typename T, int V>
__global__ void relu_forward_kernel(T* y, const T* x, int64_t n) {
  flat_loop<V>(n, [&]<int W>(int64_t i) {
    const Pack<T, W> in = load_pack<T, W>(x + i);
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = from_f32<T>(fused::relu(to_f32<T>(in.v[k])));
    store_pack<T, W>(y + i, out);
  });
}

// ReLU's backward per element, given its output y: dy's own bits where y > 0, else +0. The
// one predicate of the ReLU backward kernel and of batch norm's fused backward passes.
template <typename T>
__device__ __forceinline__ T relu_grad(T dy, T y) {
  return to_f32<T>(y) > 0.0f ? dy : from_f32<T>(0.0f);
}

// The gradient reaching a batch norm at `at`: dy's V elements, masked by relu_grad when y
// (the fused ReLU's output) is given. Both backward passes read g through this.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_bn_grad(const T* dy, const T* y, int64_t at, bool aligned) {
  Pack<T, V> gv = load_pack<T, V>(dy + at, aligned);
  if (y) {
    const Pack<T, V> yv = load_pack<T, V>(y + at, aligned);
#pragma unroll
    for (int k = 0; k < V; ++k) gv.v[k] = relu_grad<T>(gv.v[k], yv.v[k]);
  }
  return gv;
}

template <typename T, int V>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, int64_t n) {
  flat_loop<V>(n, [&]<int W>(int64_t i) {
    const Pack<T, W> g = load_pack<T, W>(dy + i), out = load_pack<T, W>(y + i);
    Pack<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = relu_grad<T>(g.v[k], out.v[k]);
    store_pack<T, W>(dx + i, r);
  });
}

template <typename T, int V>
__global__ void add_kernel(T* y, const T* a, const T* b, int64_t n) {
  flat_loop<V>(n, [&]<int W>(int64_t i) {
    const Pack<T, W> pa = load_pack<T, W>(a + i), pb = load_pack<T, W>(b + i);
    Pack<T, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = from_f32<T>(to_f32<T>(pa.v[k]) + to_f32<T>(pb.v[k]));
    store_pack<T, W>(y + i, r);
  });
}

template <typename T, int V>
__global__ void accumulate_kernel(float* dst, const T* src, int64_t n) {
  flat_loop<V>(n, [&]<int W>(int64_t i) {
    Pack<float, W> d = load_pack<float, W>(dst + i);
    const Pack<T, W> s = load_pack<T, W>(src + i);
#pragma unroll
    for (int k = 0; k < W; ++k) d.v[k] += to_f32<T>(s.v[k]);
    store_pack<float, W>(dst + i, d);
  });
}

// ---- per-channel kernels (tiling.h) -------------------------------------------------------
// Thread threadIdx.x of block (blockIdx.x, blockIdx.y) owns vector g of V channels and the
// rows of split blockIdx.y that tiling.h assigns it. `aligned`: every pointer allows
// V-element accesses; when not, the same elements are read one by one, in the same order.
// A counted loop unrolled by 4, so that a thread has several loads in flight (the sums keep
// their order). Declares r##_first and r##_count in the enclosing scope.
#define RN_TILE_ROWS(t, r)                                                \
  const int64_t r##_first = (t).row_begin(blockIdx.y, threadIdx.x);       \
  const int64_t r##_count = (t).row_count(blockIdx.y, threadIdx.x);       \
  _Pragma("unroll 4") for (int64_t r##_i = 0; r##_i < r##_count; ++r##_i) \
    if (const int64_t r = r##_first + r##_i * (t).tr; true)

// Per-channel reductions: Op::prepare<V>(g, p) loads up to two parameters per channel into
// registers, Op::add<V>(m, g, p, a, b) adds row m's two quantities. Each block writes
// partials[(split * C + c) * 2 + {0, 1}]; the row-threads are combined by a tree.
template <typename T, int V, typename Op>
__global__ void channel_partials_kernel(float* partials, ChannelTiling tl, Op op) {
  __shared__ float sa[V][kTileThreads], sb[V][kTileThreads];
  const int t = threadIdx.x;
  const int64_t g = tl.group(blockIdx.x, t);
  float a[V], b[V], p[2][V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = b[k] = 0.0f;
  if (g >= 0) {
    op.template prepare<V>(g, p);
    RN_TILE_ROWS(tl, m) op.template add<V>(m, g, p, a, b);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sa[k][t] = a[k], sb[k][t] = b[k];
  __syncthreads();
  for (int half = tl.tr / 2; half > 0; half /= 2) {
    if (t / tl.tc < half) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sa[k][t] += sa[k][t + half * tl.tc];
        sb[k][t] += sb[k][t + half * tl.tc];
      }
    }
    __syncthreads();
  }
  if (t < tl.tc && g >= 0) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = g * V + k;
      partials[(blockIdx.y * tl.C + c) * 2] = sa[k][t];
      partials[(blockIdx.y * tl.C + c) * 2 + 1] = sb[k][t];
    }
  }
}

template <typename T>
struct SumX {
  const T* x;
  int64_t C;
  bool aligned;
  template <int V>
  __device__ void prepare(int64_t, float (&)[2][V]) const {}
  template <int V>
  __device__ void add(int64_t m, int64_t g, const float (&)[2][V], float* a, float*) const {
    const Pack<T, V> v = load_pack<T, V>(x + m * C + g * V, aligned);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] += to_f32<T>(v.v[k]);
  }
};

template <typename T>
struct SumXAndSquares {
  const T* x;
  int64_t C;
  bool aligned;
  template <int V>
  __device__ void prepare(int64_t, float (&)[2][V]) const {}
  template <int V>
  __device__ void add(int64_t m, int64_t g, const float (&)[2][V], float* a, float* b) const {
    const Pack<T, V> v = load_pack<T, V>(x + m * C + g * V, aligned);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xv = to_f32<T>(v.v[k]);
      a[k] += xv;
      b[k] += xv * xv;
    }
  }
};

// Batch-norm backward's sums of g and g * xhat. g is dy, or relu_grad(dy, y) when y is given
// (the fused ReLU), stored into masked_dy when that is given (add_relu's dresidual): the same
// pass, so the masked gradient costs no pass of its own.
template <typename T>
struct SumDyAndDyXhat {
  const T* dy;
  const T* y;    // may be null: no mask
  T* masked_dy;  // may be null; only with y
  const T* x;
  const float *mean, *invstd;
  int64_t C;
  bool aligned;
  template <int V>
  __device__ void prepare(int64_t g, float (&p)[2][V]) const {
#pragma unroll
    for (int k = 0; k < V; ++k) p[0][k] = mean[g * V + k], p[1][k] = invstd[g * V + k];
  }
  template <int V>
  __device__ void add(int64_t m, int64_t g, const float (&p)[2][V], float* a, float* b) const {
    const int64_t at = m * C + g * V;
    const Pack<T, V> gv = load_bn_grad<T, V>(dy, y, at, aligned);
    const Pack<T, V> xv = load_pack<T, V>(x + at, aligned);
    if (masked_dy) store_pack<T, V>(masked_dy + at, gv, aligned);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gk = to_f32<T>(gv.v[k]);
      const float xhat = (to_f32<T>(xv.v[k]) - p[0][k]) * p[1][k];
      a[k] += gk;
      b[k] += gk * xhat;
    }
  }
};

// Batch statistics in one read of x: each thread runs Welford's update over its rows (the
// count is shared by the V channels of its vector: one division per row), the row-threads
// are merged by Chan's rule along the same tree, and each block writes
// partials[(split * C + c) * 2 + {0, 1}] = {mean, m2} of its split's rows.
template <typename T, int V>
__global__ void welford_partials_kernel(float* partials, ChannelTiling tl, const T* x, bool aligned) {
  __shared__ float sm[V][kTileThreads], sq[V][kTileThreads], sn[kTileThreads];
  const int t = threadIdx.x;
  const int64_t g = tl.group(blockIdx.x, t);
  float mean[V], m2[V], n = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) mean[k] = m2[k] = 0.0f;
  if (g >= 0) {
    RN_TILE_ROWS(tl, m) {
      const Pack<T, V> v = load_pack<T, V>(x + m * tl.C + g * V, aligned);
      n += 1.0f;
      const float inv = 1.0f / n;
#pragma unroll
      for (int k = 0; k < V; ++k) fused::welford_add(mean[k], m2[k], to_f32<T>(v.v[k]), inv);
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sm[k][t] = mean[k], sq[k][t] = m2[k];
  sn[t] = n;
  __syncthreads();
  for (int half = tl.tr / 2; half > 0; half /= 2) {
    if (t / tl.tc < half) {
      const int o = t + half * tl.tc;
      const float na = sn[t], nb = sn[o];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float nk = na, mk = sm[k][t], qk = sq[k][t];
        fused::chan_combine(nk, mk, qk, nb, sm[k][o], sq[k][o]);
        sm[k][t] = mk, sq[k][t] = qk;
      }
      sn[t] = na + nb;
    }
    __syncthreads();
  }
  if (t < tl.tc && g >= 0) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = g * V + k;
      partials[(blockIdx.y * tl.C + c) * 2] = sm[k][t];
      partials[(blockIdx.y * tl.C + c) * 2 + 1] = sq[k][t];
    }
  }
}

// The splits' {mean, m2} merged in double in a fixed order (kSplitThreads per channel, then
// those in order): mean[c] and the biased var[c] = m2 / M.
constexpr int kSplitThreads = 16;
__global__ void welford_finish_kernel(float* mean, float* var, const float* partials, ChannelTiling tl) {
  __shared__ double sn[kSplitThreads][32], sm[kSplitThreads][32], sq[kSplitThreads][32];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  double n = 0.0, mu = 0.0, q = 0.0;
  if (c < tl.C)
    for (int64_t k = threadIdx.y; k < tl.splits; k += kSplitThreads) {
      const double rows = static_cast<double>(tl.row_end(k) - k * tl.rows_per_split);
      fused::chan_combine(n, mu, q, rows, static_cast<double>(partials[(k * tl.C + c) * 2]),
                          static_cast<double>(partials[(k * tl.C + c) * 2 + 1]));
    }
  sn[threadIdx.y][threadIdx.x] = n, sm[threadIdx.y][threadIdx.x] = mu, sq[threadIdx.y][threadIdx.x] = q;
  __syncthreads();
  if (threadIdx.y == 0 && c < tl.C) {
    for (int r = 1; r < kSplitThreads; ++r)
      fused::chan_combine(n, mu, q, sn[r][threadIdx.x], sm[r][threadIdx.x], sq[r][threadIdx.x]);
    mean[c] = static_cast<float>(mu);
    var[c] = static_cast<float>(q / n);
  }
}

// The partial sums of every split, added in double in a fixed order by a block of 32
// channels x kSplitThreads split-threads, then finish(c, a, b).
template <typename Finish>
__global__ void finish_partials_kernel(const float* partials, int64_t splits, int64_t C, Finish finish) {
  __shared__ double sa[kSplitThreads][32], sb[kSplitThreads][32];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  double a = 0.0, b = 0.0;
  if (c < C)
    for (int64_t k = threadIdx.y; k < splits; k += kSplitThreads) {
      a += partials[(k * C + c) * 2];
      b += partials[(k * C + c) * 2 + 1];
    }
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int r = 1; r < kSplitThreads; ++r) a += sa[r][threadIdx.x], b += sb[r][threadIdx.x];
    finish(c, a, b);
  }
}

// a_out = a * scale (added to a_out when accumulate), b_out = b * scale; either may be null.
struct FinishTwoSums {
  float *a_out, *b_out;
  double scale;
  bool accumulate;
  __device__ void operator()(int64_t c, double a, double b) const {
    const float va = static_cast<float>(a * scale);
    if (a_out) a_out[c] = accumulate ? a_out[c] + va : va;
    if (b_out) b_out[c] = static_cast<float>(b * scale);
  }
};

// Synchronised batch norm: the two sums in double and the row count, sums[2C + 1], the
// buffer the ranks all-reduce.
struct FinishToDouble {
  double* sums;
  int64_t C, M;
  __device__ void operator()(int64_t c, double a, double b) const {
    sums[c] = a;
    sums[C + c] = b;
    if (c == 0) sums[2 * C] = static_cast<double>(M);
  }
};

// From the global sums (batch_norm.h's contract, as the CPU's SyncBatchNorm does it): mean,
// biased var = Q/m - mean^2, saved statistics and PyTorch's running update, in double.
__global__ void bn_sync_finish_forward_kernel(float* saved_mean, float* saved_invstd, float* rmean, float* rvar,
                                              const double* sums, float eps, float momentum, int64_t C) {
  RN_FOR_EACH(c, C) {
    const double m = sums[2 * C], mean = sums[c] / m;
    const double var = fmax(sums[C + c] / m - mean * mean, 0.0);
    saved_mean[c] = static_cast<float>(mean);
    saved_invstd[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    rmean[c] = static_cast<float>((1.0 - momentum) * rmean[c] + momentum * mean);
    rvar[c] = static_cast<float>((1.0 - momentum) * rvar[c] + momentum * var * m / (m - 1.0));
  }
}

// The global means of g and g*xhat, for the dx kernel with inv_count 1.
__global__ void bn_sync_finish_backward_kernel(float* mean_g, float* mean_g_xhat, const double* sums, int64_t C) {
  RN_FOR_EACH(c, C) {
    const double inv_m = 1.0 / sums[2 * C];
    mean_g[c] = static_cast<float>(sums[c] * inv_m);
    mean_g_xhat[c] = static_cast<float>(sums[C + c] * inv_m);
  }
}

// dbeta += local sum g, dgamma += local sum g*xhat (the gradient all-reduce combines ranks).
__global__ void bn_sync_accumulate_kernel(float* dgamma, float* dbeta, const double* sums, int64_t C) {
  RN_FOR_EACH(c, C) {
    dbeta[c] = static_cast<float>(static_cast<double>(dbeta[c]) + sums[c]);
    dgamma[c] = static_cast<float>(static_cast<double>(dgamma[c]) + sums[C + c]);
  }
}

__global__ void words_differ_kernel(int* mismatch, const uint32_t* a, const uint32_t* b, int64_t n) {
  RN_FOR_EACH(i, n) {
    if (a[i] != b[i]) *mismatch = 1;
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

template <typename T, int V>
__global__ void bn_apply_kernel(T* y, const T* x, const T* residual, ChannelTiling tl, bool aligned, const float* mean,
                                const float* var_or_invstd, bool is_var, float eps, const float* gamma,
                                const float* beta, int fuse) {
  const int64_t g = tl.group(blockIdx.x, threadIdx.x);
  if (g < 0) return;
  float mu[V], is[V], ga[V], be[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = g * V + k;
    mu[k] = mean[c];
    is[k] = is_var ? 1.0f / sqrtf(var_or_invstd[c] + eps) : var_or_invstd[c];
    ga[k] = gamma[c];
    be[k] = beta[c];
  }
  RN_TILE_ROWS(tl, m) {
    const int64_t at = m * tl.C + g * V;
    const Pack<T, V> xv = load_pack<T, V>(x + at, aligned);
    Pack<T, V> rv, out;
    if (fuse == 2) rv = load_pack<T, V>(residual + at, aligned);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = fused::bn_apply(to_f32<T>(xv.v[k]), mu[k], is[k], ga[k], be[k]);
      // Rounded to the storage type first, as an unfused BN then add would.
      if (fuse == 2) v = to_f32<T>(from_f32<T>(v)) + to_f32<T>(rv.v[k]);
      if (fuse != 0) v = fused::relu(v);
      out.v[k] = from_f32<T>(v);
    }
    store_pack<T, V>(y + at, out, aligned);
  }
}

// dy is masked by relu_grad(dy, y) first when y is given (the fused ReLU), as the sums were.
template <typename T, int V>
__global__ void bn_backward_dx_kernel(T* dx, const T* dy, const T* y, const T* x, ChannelTiling tl, bool aligned,
                                      float inv_m, const float* mean, const float* invstd, const float* gamma,
                                      const float* sum_dy, const float* sum_dy_xhat) {
  const int64_t g = tl.group(blockIdx.x, threadIdx.x);
  if (g < 0) return;
  float mu[V], is[V], ga[V], sd[V], sdx[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = g * V + k;
    mu[k] = mean[c], is[k] = invstd[c], ga[k] = gamma[c], sd[k] = sum_dy[c], sdx[k] = sum_dy_xhat[c];
  }
  RN_TILE_ROWS(tl, m) {
    const int64_t at = m * tl.C + g * V;
    const Pack<T, V> gv = load_bn_grad<T, V>(dy, y, at, aligned);
    const Pack<T, V> xv = load_pack<T, V>(x + at, aligned);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k)
      out.v[k] = from_f32<T>(fused::bn_backward_dx(to_f32<T>(gv.v[k]), to_f32<T>(xv.v[k]), mu[k], is[k], ga[k], sd[k],
                                                   sdx[k], inv_m));
    store_pack<T, V>(dx + at, out, aligned);
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

// Index arithmetic in I: uint32_t when every index fits (a 64-bit division is a long
// instruction sequence on the GPU, enough to make these memory-bound kernels compute-bound).
template <typename T, typename I>
__global__ void kcrs_to_krsc_kernel(T* dst, const T* src, I K, I C, I R, I S) {
  const I n = K * C * R * S;
  RN_FOR_EACH(j, n) {  // j indexes the destination KRSC
    const I i = static_cast<I>(j);
    const I c = i % C, s = (i / C) % S, r = (i / (C * S)) % R, k = i / (C * S * R);
    dst[i] = src[((k * C + c) * R + r) * S + s];
  }
}

template <typename T, typename I>
__global__ void accumulate_krsc_to_kcrs_kernel(float* dst, const T* src, I K, I C, I R, I S) {
  const I n = K * C * R * S;
  RN_FOR_EACH(j, n) {  // j indexes the destination KCRS
    const I i = static_cast<I>(j);
    const I s = i % S, r = (i / S) % R, c = (i / (S * R)) % C, k = i / (S * R * C);
    dst[i] += to_f32<T>(src[((k * R + r) * S + s) * C + c]);
  }
}

// ---- pooling ------------------------------------------------------------------------------
template <typename T, typename I>
__global__ void max_pool_forward_kernel(T* y, int32_t* argmax, const T* x, I N, I C, I H, I W, I P, I Q, int k,
                                        int stride, int pad) {
  const I n_out = N * P * Q * C;
  RN_FOR_EACH(j, n_out) {
    const I i = static_cast<I>(j);
    const I c = i % C, q = (i / C) % Q, p = (i / (C * Q)) % P, n = i / (C * Q * P);
    float best = -FLT_MAX;
    int32_t at = -1;
    for (int r = 0; r < k; ++r) {
      const int h = static_cast<int>(p) * stride - pad + r;
      if (h < 0 || h >= static_cast<int>(H)) continue;
      for (int s = 0; s < k; ++s) {
        const int w = static_cast<int>(q) * stride - pad + s;
        if (w < 0 || w >= static_cast<int>(W)) continue;
        const float v = to_f32<T>(x[((n * H + static_cast<I>(h)) * W + static_cast<I>(w)) * C + c]);
        if (at < 0 || v > best || v != v) best = v, at = h * static_cast<int>(W) + w;
      }
    }
    y[i] = from_f32<T>(best);
    argmax[i] = at;
  }
}

// Gathers, for each input element, the gradients of the outputs whose maximum it was.
template <typename T, typename I>
__global__ void max_pool_backward_kernel(T* dx, const T* dy, const int32_t* argmax, I N, I C, I H, I W, I P, I Q,
                                         int k, int stride, int pad) {
  const I n_in = N * H * W * C;
  RN_FOR_EACH(j, n_in) {
    const I i = static_cast<I>(j);
    const I c = i % C, wi = (i / C) % W, hi = (i / (C * W)) % H, n = i / (C * W * H);
    const int h = static_cast<int>(hi), w = static_cast<int>(wi);
    const int32_t me = h * static_cast<int>(W) + w;
    // Outputs p with p*stride - pad <= h <= p*stride - pad + k - 1.
    const int p0 = max(0, (h + pad - k + stride) / stride), p1 = min(static_cast<int>(P) - 1, (h + pad) / stride);
    const int q0 = max(0, (w + pad - k + stride) / stride), q1 = min(static_cast<int>(Q) - 1, (w + pad) / stride);
    float g = 0.0f;
    for (int p = p0; p <= p1; ++p)
      for (int q = q0; q <= q1; ++q) {
        const I o = ((n * P + static_cast<I>(p)) * Q + static_cast<I>(q)) * C + c;
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
    if (threadIdx.x < static_cast<unsigned>(stride)) {
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

namespace {

// RN_CUDA_VECTOR_KERNELS=0 turns the vector accesses off (V = 1), for comparisons.
std::atomic<int> g_vector_kernels{-1};

template <typename T>
constexpr int widest = 16 / static_cast<int>(sizeof(T));

// f(std::integral_constant<int, V>) with V the flat vector width for these pointers.
template <typename T, typename F>
void with_flat_width(std::initializer_list<const void*> ptrs, F&& f) {
  if (flat_vector_elems(sizeof(T), ptrs, vector_kernels()) == widest<T>)
    f(std::integral_constant<int, widest<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

// The per-channel vector width: a function of C and the element size only, so a reduction
// sums in the same order whatever the addresses (batch norm's recompute compares bits).
template <typename T, typename F>
void with_channel_width(int64_t C, F&& f) {
  if (vector_elems(sizeof(T), C, {}, vector_kernels()) == widest<T>)
    f(std::integral_constant<int, widest<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

dim3 grid_of(const ChannelTiling& tl) { return dim3(static_cast<unsigned>(tl.blocks_x), static_cast<unsigned>(tl.splits)); }

template <typename T, int V, typename Op>
void run_channel_partials(float* partials, const ChannelTiling& tl, const Op& op, cudaStream_t s) {
  RN_LAUNCH(grid_of(tl), kTileThreads, s, channel_partials_kernel<T, V, Op>)(partials, tl, op);
  RN_CUDA_LAUNCH_CHECK();
}

template <typename Finish>
void run_finish(const float* partials, int64_t splits, int64_t C, const Finish& f, cudaStream_t s) {
  RN_LAUNCH(static_cast<unsigned>((C + 31) / 32), dim3(32, kSplitThreads), s, finish_partials_kernel<Finish>)(partials, splits, C,
                                                                                                     f);
  RN_CUDA_LAUNCH_CHECK();
}

bool fits_32(int64_t n) { return n < (int64_t{1} << 32); }

// Batch-norm backward's per-channel sums of g and g * xhat (SumDyAndDyXhat: g masked by y
// when given, and stored into masked_dy), finished by `finish`.
template <typename Finish>
void dy_xhat_sums(void* masked_dy, const void* dy, const void* y, const void* x, DType t, int64_t M, int64_t C,
                  const float* mean, const float* invstd, float* partials, const Finish& finish, cudaStream_t s) {
  RN_CHECK(M > 0) << "batch-norm backward of no rows";
  RN_CHECK(masked_dy == nullptr || y != nullptr) << "batch-norm backward: a masked gradient to store but no mask (y)";
  RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      const ChannelTiling tl = channel_tiling(M, C, V);
                      const bool al = aligned_to({masked_dy, dy, y, x}, V * static_cast<int>(sizeof(T)));
                      run_channel_partials<T, V>(
                          partials, tl,
                          SumDyAndDyXhat<T>{static_cast<const T*>(dy), static_cast<const T*>(y),
                                            static_cast<T*>(masked_dy), static_cast<const T*>(x), mean, invstd, C, al},
                          s);
                      run_finish(partials, tl.splits, C, finish, s);
                    }));
}

}  // namespace

bool vector_kernels() {
  int v = g_vector_kernels.load();
  if (v < 0) {
    const char* e = std::getenv("RN_CUDA_VECTOR_KERNELS");
    v = (e && std::strcmp(e, "0") == 0) ? 0 : 1;
    g_vector_kernels.store(v);
  }
  return v == 1;
}
void set_vector_kernels(bool on) { g_vector_kernels.store(on ? 1 : 0); }

void launch_cast(void* y, DType dst, const void* x, DType src, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(src, S, RN_DISPATCH_FLOAT(dst, D, {
                      // Four elements per access: 16 bytes of fp32, 8 of a half type.
                      const bool vec = vector_kernels() && aligned_to({x}, 4 * static_cast<int>(sizeof(S))) &&
                                       aligned_to({y}, 4 * static_cast<int>(sizeof(D)));
                      if (vec)
                        RN_LAUNCH(blocks_for(n / 4 + 1, kThreads), kThreads, s, cast_kernel<S, D, 4>)(
                            static_cast<D*>(y), static_cast<const S*>(x), n);
                      else
                        RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, cast_kernel<S, D, 1>)(
                            static_cast<D*>(y), static_cast<const S*>(x), n);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_relu_forward(void* y, const void* x, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(t, T, with_flat_width<T>({y, x}, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      RN_LAUNCH(blocks_for(n / V + 1, kThreads), kThreads, s, relu_forward_kernel<T, V>)(
                          static_cast<T*>(y), static_cast<const T*>(x), n);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_relu_backward(void* dx, const void* dy, const void* y, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(t, T, with_flat_width<T>({dx, dy, y}, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      RN_LAUNCH(blocks_for(n / V + 1, kThreads), kThreads, s, relu_backward_kernel<T, V>)(
                          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), n);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_add(void* y, const void* a, const void* b, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(t, T, with_flat_width<T>({y, a, b}, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      RN_LAUNCH(blocks_for(n / V + 1, kThreads), kThreads, s, add_kernel<T, V>)(
                          static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b), n);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

int64_t channel_partials_floats(int64_t M, int64_t C) { return row_splits(M).splits * C * 2; }

void launch_bn_stats(float* mean, float* var, const void* x, DType t, int64_t M, int64_t C, float* partials,
                     cudaStream_t s) {
  RN_CHECK(M > 0) << "batch statistics of no rows";
  RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      const ChannelTiling tl = channel_tiling(M, C, V);
                      RN_LAUNCH(grid_of(tl), kTileThreads, s, welford_partials_kernel<T, V>)(
                          partials, tl, static_cast<const T*>(x), aligned_to({x}, V * static_cast<int>(sizeof(T))));
                      RN_CUDA_LAUNCH_CHECK();
                      RN_LAUNCH(static_cast<unsigned>((C + 31) / 32), dim3(32, kSplitThreads), s, welford_finish_kernel)(
                          mean, var, partials, tl);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_bn_finish_training(float* saved_mean, float* saved_invstd, float* running_mean, float* running_var,
                               const float* mean, const float* var, float eps, float momentum, int64_t M, int64_t C,
                               cudaStream_t s) {
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, bn_finish_training_kernel)(saved_mean, saved_invstd, running_mean,
                                                                         running_var, mean, var, eps, momentum, M, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_compare(int* mismatch, const float* mean, const float* var, const float* saved_mean,
                       const float* saved_invstd, float eps, int64_t C, cudaStream_t s) {
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, bn_compare_kernel)(mismatch, mean, var, saved_mean, saved_invstd, eps, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_apply(void* y, const void* x, const void* residual, DType t, int64_t M, int64_t C, const float* mean,
                     const float* var_or_invstd, bool is_var, float eps, const float* gamma, const float* beta,
                     int fuse, cudaStream_t s) {
  if (M == 0) return;
  RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      const ChannelTiling tl = channel_tiling(M, C, V);
                      const bool al = aligned_to({y, x, residual}, V * static_cast<int>(sizeof(T)));
                      RN_LAUNCH(grid_of(tl), kTileThreads, s, bn_apply_kernel<T, V>)(
                          static_cast<T*>(y), static_cast<const T*>(x), static_cast<const T*>(residual), tl, al, mean,
                          var_or_invstd, is_var, eps, gamma, beta, fuse);
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_bn_backward_sums(float* sum_dy, float* sum_dy_xhat, void* masked_dy, const void* dy, const void* y,
                             const void* x, DType t, int64_t M, int64_t C, const float* mean, const float* invstd,
                             float* partials, cudaStream_t s) {
  dy_xhat_sums(masked_dy, dy, y, x, t, M, C, mean, invstd, partials, FinishTwoSums{sum_dy, sum_dy_xhat, 1.0, false}, s);
}

void launch_bn_backward_dx(void* dx, const void* dy, const void* y, const void* x, DType t, int64_t M, int64_t C,
                           const float* mean, const float* invstd, const float* gamma, const float* sum_dy,
                           const float* sum_dy_xhat, float* dgamma, float* dbeta, cudaStream_t s, float inv_count) {
  if (inv_count < 0) inv_count = static_cast<float>(1.0 / static_cast<double>(M));
  if (M > 0) {
    RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                        const ChannelTiling tl = channel_tiling(M, C, V);
                        const bool al = aligned_to({dx, dy, y, x}, V * static_cast<int>(sizeof(T)));
                        RN_LAUNCH(grid_of(tl), kTileThreads, s, bn_backward_dx_kernel<T, V>)(
                            static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y),
                            static_cast<const T*>(x), tl, al, inv_count, mean, invstd, gamma, sum_dy, sum_dy_xhat);
                        RN_CUDA_LAUNCH_CHECK();
                      }));
  }
  if (dgamma == nullptr) return;  // synchronised BN accumulates its local sums itself
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, accumulate_stats_kernel)(dgamma, dbeta, sum_dy, sum_dy_xhat, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_sync_forward_sums(double* sums, const void* x, DType t, int64_t M, int64_t C, float* partials,
                                 cudaStream_t s) {
  RN_CHECK(M > 0) << "batch statistics of no rows";
  RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      const ChannelTiling tl = channel_tiling(M, C, V);
                      const bool al = aligned_to({x}, V * static_cast<int>(sizeof(T)));
                      run_channel_partials<T, V>(partials, tl, SumXAndSquares<T>{static_cast<const T*>(x), C, al}, s);
                      run_finish(partials, tl.splits, C, FinishToDouble{sums, C, M}, s);
                    }));
}

void launch_bn_sync_backward_sums(double* sums, void* masked_dy, const void* dy, const void* y, const void* x, DType t,
                                  int64_t M, int64_t C, const float* mean, const float* invstd, float* partials,
                                  cudaStream_t s) {
  dy_xhat_sums(masked_dy, dy, y, x, t, M, C, mean, invstd, partials, FinishToDouble{sums, C, M}, s);
}

void launch_bn_sync_finish_forward(float* saved_mean, float* saved_invstd, float* running_mean, float* running_var,
                                   const double* sums, float eps, float momentum, int64_t C, cudaStream_t s) {
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, bn_sync_finish_forward_kernel)(saved_mean, saved_invstd, running_mean,
                                                                             running_var, sums, eps, momentum, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_sync_finish_backward(float* mean_g, float* mean_g_xhat, const double* sums, int64_t C, cudaStream_t s) {
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, bn_sync_finish_backward_kernel)(mean_g, mean_g_xhat, sums, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bn_sync_accumulate(float* dgamma, float* dbeta, const double* sums, int64_t C, cudaStream_t s) {
  RN_LAUNCH(blocks_for(C, kThreads), kThreads, s, bn_sync_accumulate_kernel)(dgamma, dbeta, sums, C);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_words_differ(int* mismatch, const void* a, const void* b, int64_t words, cudaStream_t s) {
  if (words == 0) return;
  RN_LAUNCH(blocks_for(words, kThreads), kThreads, s, words_differ_kernel)(mismatch, static_cast<const uint32_t*>(a),
                                                                       static_cast<const uint32_t*>(b), words);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_bias_add(void* y, const float* b, DType t, int64_t M, int64_t C, cudaStream_t s) {
  const int64_t n = M * C;
  RN_DISPATCH_FLOAT(t, T, {
    RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, bias_add_kernel<T>)(static_cast<T*>(y), b, n, C);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bias_grad(float* db, const void* dy, DType t, int64_t M, int64_t C, float* partials, cudaStream_t s) {
  if (M == 0) return;  // nothing to add
  RN_DISPATCH_FLOAT(t, T, with_channel_width<T>(C, [&](auto v_) {
                      constexpr int V = decltype(v_)::value;
                      const ChannelTiling tl = channel_tiling(M, C, V);
                      const bool al = aligned_to({dy}, V * static_cast<int>(sizeof(T)));
                      run_channel_partials<T, V>(partials, tl, SumX<T>{static_cast<const T*>(dy), C, al}, s);
                      run_finish(partials, tl.splits, C, FinishTwoSums{db, nullptr, 1.0, true}, s);
                    }));
}

void launch_kcrs_to_krsc(void* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                         cudaStream_t s) {
  const int64_t n = K * C * R * S;
  RN_DISPATCH_FLOAT(t, T, {
    if (fits_32(n))
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, kcrs_to_krsc_kernel<T, uint32_t>)(
          static_cast<T*>(dst), static_cast<const T*>(src), static_cast<uint32_t>(K), static_cast<uint32_t>(C),
          static_cast<uint32_t>(R), static_cast<uint32_t>(S));
    else
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, kcrs_to_krsc_kernel<T, int64_t>)(static_cast<T*>(dst), static_cast<const T*>(src), K, C, R, S);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_accumulate_krsc_to_kcrs(float* dst, const void* src, DType t, int64_t K, int64_t C, int64_t R, int64_t S,
                                    cudaStream_t s) {
  const int64_t n = K * C * R * S;
  RN_DISPATCH_FLOAT(t, T, {
    if (fits_32(n))
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, accumulate_krsc_to_kcrs_kernel<T, uint32_t>)(
          dst, static_cast<const T*>(src), static_cast<uint32_t>(K), static_cast<uint32_t>(C),
          static_cast<uint32_t>(R), static_cast<uint32_t>(S));
    else
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, accumulate_krsc_to_kcrs_kernel<T, int64_t>)(dst, static_cast<const T*>(src), K, C, R, S);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_accumulate(float* dst, const void* src, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  RN_DISPATCH_FLOAT(t, T, {
    // Four elements per access: 16 bytes of the fp32 destination.
    if (vector_kernels() && aligned_to({dst}, 16) && aligned_to({src}, 4 * static_cast<int>(sizeof(T))))
      RN_LAUNCH(blocks_for(n / 4 + 1, kThreads), kThreads, s, accumulate_kernel<T, 4>)(dst, static_cast<const T*>(src), n);
    else
      RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, accumulate_kernel<T, 1>)(dst, static_cast<const T*>(src), n);
    RN_CUDA_LAUNCH_CHECK();
  });
}

// Pooling indices: uint32_t when the larger tensor's indices fit.
#define RN_WITH_INDEX(n, I, ...)  \
  if (fits_32(n)) {               \
    using I = uint32_t;           \
    __VA_ARGS__;                  \
  } else {                        \
    using I = int64_t;            \
    __VA_ARGS__;                  \
  }

void launch_max_pool_forward(void* y, int32_t* argmax, const void* x, DType t, int64_t N, int64_t C, int64_t H,
                             int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s) {
  RN_CHECK(H * W < (int64_t{1} << 31)) << "max pooling: H*W = " << H * W << " does not fit the int32 workspace";
  RN_DISPATCH_FLOAT(t, T, RN_WITH_INDEX(std::max(N * H * W, N * P * Q) * C, I, {
                      RN_LAUNCH(blocks_for(N * P * Q * C, kThreads), kThreads, s, max_pool_forward_kernel<T, I>)(
                          static_cast<T*>(y), argmax, static_cast<const T*>(x), static_cast<I>(N), static_cast<I>(C),
                          static_cast<I>(H), static_cast<I>(W), static_cast<I>(P), static_cast<I>(Q),
                          static_cast<int>(k), static_cast<int>(stride), static_cast<int>(pad));
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_max_pool_backward(void* dx, const void* dy, const int32_t* argmax, DType t, int64_t N, int64_t C, int64_t H,
                              int64_t W, int64_t P, int64_t Q, int64_t k, int64_t stride, int64_t pad, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, RN_WITH_INDEX(std::max(N * H * W, N * P * Q) * C, I, {
                      RN_LAUNCH(blocks_for(N * H * W * C, kThreads), kThreads, s, max_pool_backward_kernel<T, I>)(
                          static_cast<T*>(dx), static_cast<const T*>(dy), argmax, static_cast<I>(N),
                          static_cast<I>(C), static_cast<I>(H), static_cast<I>(W), static_cast<I>(P),
                          static_cast<I>(Q), static_cast<int>(k), static_cast<int>(stride), static_cast<int>(pad));
                      RN_CUDA_LAUNCH_CHECK();
                    }));
}

void launch_global_avg_pool_forward(void* y, const void* x, DType t, int64_t N, int64_t C, int64_t HW, cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    RN_LAUNCH(blocks_for(N * C, kThreads), kThreads, s, gap_forward_kernel<T>)(static_cast<T*>(y), static_cast<const T*>(x), N, C, HW);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_global_avg_pool_backward(void* dx, const void* dy, DType t, int64_t N, int64_t C, int64_t HW,
                                     cudaStream_t s) {
  RN_DISPATCH_FLOAT(t, T, {
    RN_LAUNCH(blocks_for(N * HW * C, kThreads), kThreads, s, gap_backward_kernel<T>)(static_cast<T*>(dx),
                                                                                 static_cast<const T*>(dy), N, C, HW);
    RN_CUDA_LAUNCH_CHECK();
  });
}

void launch_softmax_ce_forward(float* loss, float* probs, float* per_sample, const float* logits, const int32_t* labels,
                               int64_t N, int64_t K, float smoothing, int* bad_label, cudaStream_t s) {
  RN_LAUNCH(static_cast<unsigned>(N), kThreads, s, softmax_ce_forward_kernel)(probs, per_sample, logits, labels, K,
                                                                          smoothing, bad_label);
  RN_CUDA_LAUNCH_CHECK();
  RN_LAUNCH(1, kThreads, s, mean_kernel)(loss, per_sample, N);
  RN_CUDA_LAUNCH_CHECK();
}

void launch_softmax_ce_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t N, int64_t K,
                                float smoothing, float grad_scale, const float* scale_source, cudaStream_t s) {
  RN_LAUNCH(blocks_for(N * K, kThreads), kThreads, s, softmax_ce_backward_kernel)(dlogits, probs, labels, N, K, smoothing,
                                                                              grad_scale, scale_source);
  RN_CUDA_LAUNCH_CHECK();
}

}  // namespace rn::cuda

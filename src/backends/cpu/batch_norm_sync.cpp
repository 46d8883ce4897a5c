// Synchronised batch norm (M = N*H*W values per channel on this rank).
//   forward:  S = sum x, Q = sum x^2 per channel in fp64; reduce [S, Q, M] over the ranks;
//             mean = S/M, var = max(Q/M - mean^2, 0), invstd = 1/sqrt(var + eps) from the
//             global sums, rounded to fp32 and saved; then
//             y = [relu]((x - mean) * gamma*invstd + beta [+ residual]) in fp32 from those
//             saved values (forward_recompute has only them), rounded once to the dtype.
//   backward: g = dy * (y > 0) when fused, xhat = (x - mean) * invstd;
//             local sum g and sum g*xhat in fp64, dbeta/dgamma += them; reduce
//             [sum g, sum g*xhat, M]; dx = gamma*invstd * (g - sum g/M - xhat * sum(g xhat)/M)
//             with the global sums, dresidual = g.
// NHWC runs the passes of the per-rank NHWC loops (batch_norm_nhwc.h: sums in vector
// registers, here with fp64 accumulators) with the reductions between them; NCHW runs the
// OpenMP loops below, parallel over channels. Both are fp32 per element with fp64 sums (so
// the ranks' sums add up to the whole batch's to fp64 rounding, and W ranks of batch B get
// the statistics of one batch of W*B to the last bit nearly always), and both give the same
// bits for a fixed thread count every time, which forward_recompute's check relies on. Every
// element pass reads an element before writing it, so dx may be dy.
#include "backends/cpu/batch_norm_sync.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "backends/cpu/batch_norm_nhwc.h"
#include "core/check.h"

namespace rn::cpu {
namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

struct Geometry {  // NCHW
  int64_t n, c, hw;
};

// out[c] = sum of u and out[C + c] = sum of v over channel c's elements (NCHW), where
// term(i, c, &u, &v) gives the two terms of the element at offset i.
template <typename Term>
void sum_per_channel(const Geometry& g, double* out, Term term) {
  const int64_t C = g.c;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double su = 0.0, sv = 0.0;
    for (int64_t n = 0; n < g.n; ++n) {
      const int64_t base = (n * C + c) * g.hw;
#pragma omp simd reduction(+ : su, sv)
      for (int64_t i = 0; i < g.hw; ++i) {
        double u, v;
        term(base + i, c, &u, &v);
        su += u;
        sv += v;
      }
    }
    out[c] = su;
    out[C + c] = sv;
  }
}

// Calls fn(i, c) for every element (offset i, channel c; NCHW), in parallel.
template <typename Fn>
void for_each_element(const Geometry& g, Fn fn) {
  const int64_t C = g.c;
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < g.n * C; ++plane) {
    const int64_t c = plane % C, base = plane * g.hw;
#pragma omp simd
    for (int64_t i = 0; i < g.hw; ++i) fn(base + i, c);
  }
}

template <typename T>
void sums_of_x(const Geometry& g, double* out, const void* x) {
  const T* xp = static_cast<const T*>(x);
  sum_per_channel(g, out, [xp](int64_t i, int64_t, double* u, double* v) {
    const double e = load(xp, i);
    *u = e;
    *v = e * e;
  });
}

template <typename T>
void normalize_as(const Geometry& g, void* y, const void* x, const void* residual, bool relu, const float* mean,
                  const float* scale, const float* beta) {
  T* yp = static_cast<T*>(y);
  const T* xp = static_cast<const T*>(x);
  const T* rp = static_cast<const T*>(residual);
  for_each_element(g, [=](int64_t i, int64_t c) {
    float z = (load(xp, i) - mean[c]) * scale[c] + beta[c];
    if (rp != nullptr) z += load(rp, i);
    store(yp, i, relu && z < 0.0f ? 0.0f : z);  // NaN propagates
  });
}

struct GradPointers {
  void* dx;
  void* dresidual;  // null unless add_relu
  const void *dy, *x, *y;
  bool masked;  // fused ReLU: g = dy * (y > 0)
};

template <typename T>
float masked_grad(const GradPointers& a, int64_t i) {
  return a.masked && !(load(static_cast<const T*>(a.y), i) > 0.0f) ? 0.0f : load(static_cast<const T*>(a.dy), i);
}

template <typename T>
void grad_sums(const Geometry& g, double* out, const GradPointers& a, const float* mean, const float* invstd) {
  const T* xp = static_cast<const T*>(a.x);
  sum_per_channel(g, out, [&a, xp, mean, invstd](int64_t i, int64_t c, double* u, double* v) {
    const float gr = masked_grad<T>(a, i);
    const float xhat = (load(xp, i) - mean[c]) * invstd[c];
    *u = gr;
    *v = static_cast<double>(gr) * xhat;
  });
}

template <typename T>
void grad_input(const Geometry& g, const GradPointers& a, const float* mean, const float* invstd, const float* scale,
                const float* mean_g, const float* mean_g_xhat) {
  T* dxp = static_cast<T*>(a.dx);
  T* drp = static_cast<T*>(a.dresidual);
  const T* xp = static_cast<const T*>(a.x);
  for_each_element(g, [=, &a](int64_t i, int64_t c) {
    const float gr = masked_grad<T>(a, i);
    const float xhat = (load(xp, i) - mean[c]) * invstd[c];
    if (drp != nullptr) store(drp, i, gr);
    store(dxp, i, scale[c] * (gr - mean_g[c] - xhat * mean_g_xhat[c]));
  });
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(const BatchNormDesc& d) : d_(d), m_(d.batch * d.h * d.w) {
  RN_CHECK(d.dtype == DType::f32 || d.dtype == DType::bf16)
      << d.str() << ": synchronised batch norm on the CPU computes fp32 or bf16 only";
  RN_CHECK(!d.mixed() || d.layout == Layout::nhwc)
      << d.str() << ": a bf16 y or dx from fp32 x is for the NHWC loops only";
  const auto C = static_cast<size_t>(d.channels);
  sync_.resize(2 * C + 1);
  for (auto* v : {&mean_, &invstd_, &scale_, &mean_g_, &mean_g_xhat_, &a_, &b_, &e_}) v->resize(C);
  if (d.layout == Layout::nhwc) nhwc_ = std::make_unique<NhwcBatchNorm>(d);
}

SyncBatchNorm::~SyncBatchNorm() = default;

void SyncBatchNorm::local_sums_of_x(const Tensor& x) {
  if (nhwc_) return nhwc_->sums_of_x(x, sync_.data());
  const Geometry g{d_.batch, d_.channels, d_.h * d_.w};
  if (d_.dtype == DType::bf16)
    sums_of_x<bf16_t>(g, sync_.data(), x.data);
  else
    sums_of_x<float>(g, sync_.data(), x.data);
}

void SyncBatchNorm::set_affine(const Tensor& gamma, const Tensor& saved_mean, const Tensor& saved_invstd) {
  for (int64_t c = 0; c < d_.channels; ++c) {
    const auto k = static_cast<size_t>(c);
    mean_[k] = saved_mean.ptr<float>()[c];
    invstd_[k] = saved_invstd.ptr<float>()[c];
    scale_[k] = gamma.ptr<float>()[c] * invstd_[k];
  }
}

void SyncBatchNorm::normalize(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                              const Tensor& beta) {
  // The NHWC loops form scale = gamma * invstd as set_affine does: the same fp32 product.
  if (nhwc_)
    return nhwc_->normalize(y, x, residual, mean_.data(), invstd_.data(), gamma.ptr<float>(), beta.ptr<float>());
  const Geometry g{d_.batch, d_.channels, d_.h * d_.w};
  const void* r = residual != nullptr ? residual->data : nullptr;
  const bool relu = d_.fuse != BnFuse::none;
  if (d_.dtype == DType::bf16)
    normalize_as<bf16_t>(g, y.data, x.data, r, relu, mean_.data(), scale_.data(), beta.ptr<float>());
  else
    normalize_as<float>(g, y.data, x.data, r, relu, mean_.data(), scale_.data(), beta.ptr<float>());
}

void SyncBatchNorm::forward_training(BatchStatsReducer& reducer, const Tensor& y, const Tensor& saved_mean,
                                     const Tensor& saved_invstd, const Tensor& x, const Tensor* residual,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                     const Tensor& running_var) {
  const int64_t C = d_.channels;
  local_sums_of_x(x);
  sync_[static_cast<size_t>(2 * C)] = static_cast<double>(m_);
  forward_sums_.assign(sync_.begin(), sync_.end() - 1);
  reducer.sum(sync_.data(), 2 * C + 1);
  const double m = sync_[static_cast<size_t>(2 * C)];
  // Every rank sees the same global count, so all of them throw here, or none.
  RN_CHECK(m > 1.0) << d_.str() << ": synchronised training needs more than one value per channel over all ranks "
                    << "(N*H*W summed = " << m << ")";
  const double momentum = d_.momentum;
  for (int64_t c = 0; c < C; ++c) {
    const double mean = sync_[static_cast<size_t>(c)] / m;
    const double var = std::max(sync_[static_cast<size_t>(C + c)] / m - mean * mean, 0.0);
    saved_mean.ptr<float>()[c] = static_cast<float>(mean);
    saved_invstd.ptr<float>()[c] = static_cast<float>(1.0 / std::sqrt(var + d_.eps));
    float& rm = running_mean.ptr<float>()[c];
    float& rv = running_var.ptr<float>()[c];
    rm = static_cast<float>((1.0 - momentum) * rm + momentum * mean);
    rv = static_cast<float>((1.0 - momentum) * rv + momentum * var * m / (m - 1.0));
  }
  forward_saved_.assign(saved_mean.ptr<float>(), saved_mean.ptr<float>() + C);
  forward_saved_.insert(forward_saved_.end(), saved_invstd.ptr<float>(), saved_invstd.ptr<float>() + C);
  set_affine(gamma, saved_mean, saved_invstd);
  normalize(y, x, residual, gamma, beta);
}

void SyncBatchNorm::forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                      const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) {
  const int64_t C = d_.channels;
  RN_CHECK(static_cast<int64_t>(forward_sums_.size()) == 2 * C)
      << d_.str() << ": forward_recompute with a stats reducer needs a synchronised forward_training first";
  // The statistics cannot be recomputed without communicating; instead this rank's sums
  // and the saved statistics must be those of the last forward, bit for bit.
  local_sums_of_x(x);
  for (int64_t c = 0; c < C; ++c) {
    const auto k = static_cast<size_t>(c), kc = static_cast<size_t>(C + c);
    RN_CHECK(std::bit_cast<uint64_t>(sync_[k]) == std::bit_cast<uint64_t>(forward_sums_[k]) &&
             std::bit_cast<uint64_t>(sync_[kc]) == std::bit_cast<uint64_t>(forward_sums_[kc]) &&
             std::bit_cast<uint32_t>(saved_mean.ptr<float>()[c]) == std::bit_cast<uint32_t>(forward_saved_[k]) &&
             std::bit_cast<uint32_t>(saved_invstd.ptr<float>()[c]) == std::bit_cast<uint32_t>(forward_saved_[kc]))
        << d_.str() << ": channel " << c
        << ": the input or the saved statistics differ from those of the last synchronised forward_training";
  }
  set_affine(gamma, saved_mean, saved_invstd);
  normalize(y, x, residual, gamma, beta);
}

void SyncBatchNorm::backward(BatchStatsReducer& reducer, const Tensor& dx, const Tensor* dresidual,
                             const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy, const Tensor& x,
                             const Tensor& y, const Tensor& gamma, const Tensor& saved_mean,
                             const Tensor& saved_invstd) {
  const int64_t C = d_.channels;
  const Geometry g{d_.batch, C, d_.h * d_.w};
  const GradPointers a{
      dx.data, dresidual != nullptr ? dresidual->data : nullptr, dy.data, x.data, y.data, d_.fuse != BnFuse::none};
  set_affine(gamma, saved_mean, saved_invstd);
  const bool bf16 = d_.dtype == DType::bf16;
  const Tensor* grad = nullptr;  // NHWC: where the first pass left g
  if (nhwc_) {
    grad = &nhwc_->gradient_sums(dx, dresidual, dy, x, y, mean_.data(), sync_.data());
    for (int64_t c = 0; c < C; ++c) sync_[static_cast<size_t>(C + c)] *= invstd_[static_cast<size_t>(c)];
  } else if (bf16) {
    grad_sums<bf16_t>(g, sync_.data(), a, mean_.data(), invstd_.data());
  } else {
    grad_sums<float>(g, sync_.data(), a, mean_.data(), invstd_.data());
  }
  for (int64_t c = 0; c < C; ++c) {  // the local sums: the gradient all-reduce combines them
    dbeta.ptr<float>()[c] = static_cast<float>(dbeta.ptr<float>()[c] + sync_[static_cast<size_t>(c)]);
    dgamma.ptr<float>()[c] = static_cast<float>(dgamma.ptr<float>()[c] + sync_[static_cast<size_t>(C + c)]);
  }
  sync_[static_cast<size_t>(2 * C)] = static_cast<double>(m_);
  reducer.sum(sync_.data(), 2 * C + 1);
  const double inv_m = 1.0 / sync_[static_cast<size_t>(2 * C)];
  if (nhwc_) {
    // dx = a g + (b (x - mean) + e): a = scale, b = -a invstd mean(g xhat), e = -a mean(g)
    for (int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<size_t>(c);
      const double sa = scale_[k];
      a_[k] = scale_[k];
      b_[k] = static_cast<float>(-sa * invstd_[k] * sync_[static_cast<size_t>(C) + k] * inv_m);
      e_[k] = static_cast<float>(-sa * sync_[k] * inv_m);
    }
    return nhwc_->gradient_input(dx, *grad, x, mean_.data(), a_.data(), b_.data(), e_.data());
  }
  for (int64_t c = 0; c < C; ++c) {
    mean_g_[static_cast<size_t>(c)] = static_cast<float>(sync_[static_cast<size_t>(c)] * inv_m);
    mean_g_xhat_[static_cast<size_t>(c)] = static_cast<float>(sync_[static_cast<size_t>(C + c)] * inv_m);
  }
  if (bf16)
    grad_input<bf16_t>(g, a, mean_.data(), invstd_.data(), scale_.data(), mean_g_.data(), mean_g_xhat_.data());
  else
    grad_input<float>(g, a, mean_.data(), invstd_.data(), scale_.data(), mean_g_.data(), mean_g_xhat_.data());
}

}  // namespace rn::cpu

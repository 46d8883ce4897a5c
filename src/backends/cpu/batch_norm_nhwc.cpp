// NHWC batch norm loops (batch_norm_nhwc.h). Each pass is a function over a range of pixels,
// compiled three times (target_clones) and called from an OpenMP region. The summing passes
// go over blocks of channels with the sums in registers (block_sums); the element passes
// are `omp simd` over the C contiguous channels of each pixel.
#include "backends/cpu/batch_norm_nhwc.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/check.h"

namespace rn::cpu {
namespace {

// Pixels summed in fp32 (in registers) before they are added to the fp64 sums.
constexpr int64_t kChunk = 128;

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16_t* p, int64_t i) {
  return std::bit_cast<float>(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16);
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
// f32_to_bf16 without a branch (so that it vectorises): round to nearest even, NaN made quiet.
inline void store(bf16_t* p, int64_t i, float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// Sums over pixels [a, b) of channels [c0, c0 + B): term(offset, c, &u, &v) gives two fp32
// values per element, and S[c] += sum of u, S[C + c] += sum of u * v. The B-wide accumulators,
// of type A, are local arrays that the compiler keeps in vector registers across the pixel
// loop; accumulating in memory instead (a [C] row per thread) made every add wait for the
// previous store, 4-8x slower on ResNet shapes. With A = double (the synchronised batch norm)
// u * v is formed in fp64, exactly.
// Staged: the terms go through a small array first. With fp64 sums and the backward's terms
// (which store g) GCC left the one-loop form scalar, 4x slower; for the forward's terms and
// for fp32 sums the one-loop form is the faster (measured with rn_micro).
template <int B, typename A, bool Staged, typename Term>
inline __attribute__((always_inline)) void block_sums(int64_t a, int64_t b, int64_t C, int64_t c0, double* S,
                                                      Term term) {
  A su[B] = {}, sv[B] = {};
  for (int64_t p = a; p < b; ++p) {
    const int64_t o = p * C + c0;
    if constexpr (Staged) {
      float u[B], v[B];
#pragma omp simd
      for (int j = 0; j < B; ++j) term(o + j, c0 + j, &u[j], &v[j]);
#pragma omp simd
      for (int j = 0; j < B; ++j) {
        const A e = u[j];
        su[j] += e;
        sv[j] += e * v[j];
      }
    } else {
#pragma omp simd
      for (int j = 0; j < B; ++j) {
        float u, v;
        term(o + j, c0 + j, &u, &v);
        const A e = u;
        su[j] += e;
        sv[j] += e * v;
      }
    }
  }
  for (int j = 0; j < B; ++j) {
    S[c0 + j] += su[j];
    S[C + c0 + j] += sv[j];
  }
}

// How a pass sums: fp32 over chunks of pixels (the per-rank loops), or fp64 in one loop or
// staged (the synchronised batch norm's).
enum class Sum64 { no, direct, staged };

// The sums of block_sums over pixels [p0, p1) and all C channels, kChunk pixels at a time (so
// that the chunk stays in cache while each block of channels goes over it; fp32 sums are
// added to the fp64 S chunk by chunk), in blocks of 64 channels (fp64: 32, the same
// registers), then 16, then 1.
template <Sum64 Mode, typename Term>
inline __attribute__((always_inline)) void chunked_sums(int64_t p0, int64_t p1, int64_t C, double* S, Term term) {
  using A = std::conditional_t<Mode == Sum64::no, float, double>;
  constexpr bool kStaged = Mode == Sum64::staged;
  constexpr int kWide = Mode == Sum64::no ? 64 : 32;
  for (int64_t a = p0; a < p1; a += kChunk) {
    const int64_t b = std::min(a + kChunk, p1);
    int64_t c0 = 0;
    for (; c0 + kWide <= C; c0 += kWide) block_sums<kWide, A, kStaged>(a, b, C, c0, S, term);
    for (; c0 + 16 <= C; c0 += 16) block_sums<16, A, kStaged>(a, b, C, c0, S, term);
    for (; c0 < C; ++c0) block_sums<1, A, kStaged>(a, b, C, c0, S, term);
  }
}

// Sums of d = x - K and d^2 (fp32 chunks).
template <typename T>
inline __attribute__((always_inline)) void stats_body(const T* x, const float* K, int64_t p0, int64_t p1, int64_t C,
                                                      double* S) {
  chunked_sums<Sum64::no>(p0, p1, C, S, [=](int64_t i, int64_t c, float* u, float* v) { *u = *v = load(x, i) - K[c]; });
}

// The synchronised batch norm's sums of x and x^2, fp64 per element (x^2 of an fp32 value is
// exact in fp64, and no shift is needed): the same to fp64 rounding however the pixels are
// split over ranks and threads.
template <typename T>
inline __attribute__((always_inline)) void stats64_body(const T* x, int64_t p0, int64_t p1, int64_t C, double* S) {
  chunked_sums<Sum64::direct>(p0, p1, C, S, [=](int64_t i, int64_t, float* u, float* v) { *u = *v = load(x, i); });
}

// Y: y's type; X: x's and the residual's (precision O1 writes a bf16 y from an fp32 x).
template <typename Y, typename X>
inline __attribute__((always_inline)) void normalize_body(Y* y, const X* x, const X* r, bool relu, const float* mean,
                                                          const float* scale, const float* beta, int64_t p0, int64_t p1,
                                                          int64_t C) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t o = p * C;
    if (r != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float z = (load(x, o + c) - mean[c]) * scale[c] + beta[c] + load(r, o + c);
        store(y, o + c, z < 0.0f ? 0.0f : z);  // NaN propagates
      }
    } else if (relu) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float z = (load(x, o + c) - mean[c]) * scale[c] + beta[c];
        store(y, o + c, z < 0.0f ? 0.0f : z);
      }
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) store(y, o + c, (load(x, o + c) - mean[c]) * scale[c] + beta[c]);
    }
  }
}

// g = dy where y > 0, else 0 (y NaN: 0), copied as it is (bf16: its bits), so g is exact.
inline float masked(const float* dy, const float* y, float* g, int64_t i) {
  const float d = dy[i], v = y[i];  // both loaded unconditionally: a select, not a branch
  return g[i] = v > 0.0f ? d : 0.0f;
}
inline float masked(const bf16_t* dy, const bf16_t* y, bf16_t* g, int64_t i) {
  const uint16_t d = reinterpret_cast<const uint16_t*>(dy)[i];
  const uint16_t kept = load(y, i) > 0.0f ? d : uint16_t{0};
  reinterpret_cast<uint16_t*>(g)[i] = kept;
  return std::bit_cast<float>(static_cast<uint32_t>(kept) << 16);
}
// A bf16 dy kept in an fp32 g (an fp32 dresidual under a bf16 y): widened, so still exact.
inline float masked(const bf16_t* dy, const bf16_t* y, float* g, int64_t i) {
  const float d = load(dy, i);
  return g[i] = load(y, i) > 0.0f ? d : 0.0f;
}

// Sums of g and g * (x - mean); with y (fused ReLU) g = dy * (y > 0) is also written to g_out.
// Mode: Sum64::no (per rank) or Sum64::staged (synchronised: fp64). G: g_out's type (that of
// dresidual or dx, where g is kept), Y: dy's and y's, X: x's.
template <Sum64 Mode, typename G, typename Y, typename X>
inline __attribute__((always_inline)) void grad_sums_body(G* g_out, const Y* dy, const Y* y, const X* x,
                                                          const float* mean, int64_t p0, int64_t p1, int64_t C,
                                                          double* S) {
  if (y != nullptr) {
    chunked_sums<Mode>(p0, p1, C, S, [=](int64_t i, int64_t c, float* u, float* v) {
      *u = masked(dy, y, g_out, i);
      *v = load(x, i) - mean[c];
    });
  } else {
    chunked_sums<Mode>(p0, p1, C, S, [=](int64_t i, int64_t c, float* u, float* v) {
      *u = load(dy, i);
      *v = load(x, i) - mean[c];
    });
  }
}

// dx = A g + (B (x - mean) + E) per channel. D: dx's type, G: g's, X: x's.
template <typename D, typename G, typename X>
inline __attribute__((always_inline)) void grad_input_body(D* dx, const G* g, const X* x, const float* mean,
                                                           const float* A, const float* B, const float* E, int64_t p0,
                                                           int64_t p1, int64_t C) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t o = p * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      store(dx, o + c, A[c] * load(g, o + c) + (B[c] * (load(x, o + c) - mean[c]) + E[c]));
  }
}

// The dispatched instantiations: one clone per x86-64 level, chosen when the program loads,
// each with an overload (stats, normalize_range, ...) so that the driver below is written
// once. v4 (AVX-512 F/BW/DQ/VL) rather than "avx512f" alone: the bf16 conversions need BW
// and VL to vectorise well (measured: normalise 2x faster in bf16, fp32 unchanged).
// Instantiated: every tensor in fp32 or every one in bf16, and precision O1's mixes (x,
// residual and dresidual fp32; y, dy and dx each fp32 or bf16).
#define RN_BN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define RN_BN_X(X, n)                                                                                     \
  RN_BN_CLONES void stats_##n(const X* x, const float* K, int64_t p0, int64_t p1, int64_t C, double* S) { \
    stats_body(x, K, p0, p1, C, S);                                                                       \
  }                                                                                                       \
  void stats(const X* x, const float* K, int64_t p0, int64_t p1, int64_t C, double* S) {                  \
    stats_##n(x, K, p0, p1, C, S);                                                                        \
  }                                                                                                       \
  RN_BN_CLONES void stats64_##n(const X* x, int64_t p0, int64_t p1, int64_t C, double* S) {               \
    stats64_body(x, p0, p1, C, S);                                                                        \
  }                                                                                                       \
  void stats64(const X* x, int64_t p0, int64_t p1, int64_t C, double* S) { stats64_##n(x, p0, p1, C, S); }
#define RN_BN_YX(Y, X, n)                                                                                         \
  RN_BN_CLONES void normalize_##n(Y* y, const X* x, const X* r, bool relu, const float* mean, const float* scale, \
                                  const float* beta, int64_t p0, int64_t p1, int64_t C) {                         \
    normalize_body(y, x, r, relu, mean, scale, beta, p0, p1, C);                                                  \
  }                                                                                                               \
  void normalize_range(Y* y, const X* x, const X* r, bool relu, const float* mean, const float* scale,            \
                       const float* beta, int64_t p0, int64_t p1, int64_t C) {                                    \
    normalize_##n(y, x, r, relu, mean, scale, beta, p0, p1, C);                                                   \
  }
// fn (grad_sums: fp32 chunks, grad_sums64: fp64) over G g, Y dy and y, X x.
#define RN_BN_GRAD_SUMS(fn, mode, G, Y, X, n)                                                                      \
  RN_BN_CLONES void fn##_##n(G* g, const Y* dy, const Y* y, const X* x, const float* mean, int64_t p0, int64_t p1, \
                             int64_t C, double* S) {                                                               \
    grad_sums_body<mode>(g, dy, y, x, mean, p0, p1, C, S);                                                         \
  }                                                                                                                \
  void fn(G* g, const Y* dy, const Y* y, const X* x, const float* mean, int64_t p0, int64_t p1, int64_t C,         \
          double* S) {                                                                                             \
    fn##_##n(g, dy, y, x, mean, p0, p1, C, S);                                                                     \
  }
#define RN_BN_GYX(G, Y, X, n)                       \
  RN_BN_GRAD_SUMS(grad_sums, Sum64::no, G, Y, X, n) \
  RN_BN_GRAD_SUMS(grad_sums64, Sum64::staged, G, Y, X, n)
#define RN_BN_DGX(D, G, X, n)                                                                                        \
  RN_BN_CLONES void grad_input_##n(D* dx, const G* g, const X* x, const float* mean, const float* A, const float* B, \
                                   const float* E, int64_t p0, int64_t p1, int64_t C) {                              \
    grad_input_body(dx, g, x, mean, A, B, E, p0, p1, C);                                                             \
  }                                                                                                                  \
  void grad_input(D* dx, const G* g, const X* x, const float* mean, const float* A, const float* B, const float* E,  \
                  int64_t p0, int64_t p1, int64_t C) {                                                               \
    grad_input_##n(dx, g, x, mean, A, B, E, p0, p1, C);                                                              \
  }
RN_BN_X(float, f32)
RN_BN_X(bf16_t, bf16)
RN_BN_YX(float, float, f32)
RN_BN_YX(bf16_t, bf16_t, bf16)
RN_BN_YX(bf16_t, float, o1)
RN_BN_GYX(float, float, float, f32)
RN_BN_GYX(bf16_t, bf16_t, bf16_t, bf16)
RN_BN_GYX(bf16_t, bf16_t, float, o1_relu)
RN_BN_GYX(float, bf16_t, float, o1_add_relu)
RN_BN_DGX(float, float, float, f32)
RN_BN_DGX(bf16_t, bf16_t, bf16_t, bf16)
RN_BN_DGX(bf16_t, bf16_t, float, o1_half)
RN_BN_DGX(bf16_t, float, float, o1_dx)
RN_BN_DGX(float, bf16_t, float, o1_y)
#undef RN_BN_DGX
#undef RN_BN_GYX
#undef RN_BN_GRAD_SUMS
#undef RN_BN_YX
#undef RN_BN_X
#undef RN_BN_CLONES

// A combination not instantiated above: the kernel's constructor refuses descriptors that
// would need one, so reaching this is a bug.
void no_instance(const char* pass) {
  RN_FAIL() << "batch_norm nhwc: no " << pass << " loop for this combination of dtypes";
}
// (C varargs: the worst match, so any overload above that fits is taken instead.)
void normalize_range(...) { no_instance("normalize"); }
void grad_sums(...) { no_instance("gradient-sum"); }
void grad_sums64(...) { no_instance("gradient-sum"); }
void grad_input(...) { no_instance("input-gradient"); }

// f(T{}) with T the C++ type of an NHWC loop's dtype (fp32 or bf16).
template <typename F>
void with_type(DType t, F&& f) {
  if (t == DType::bf16)
    f(bf16_t{});
  else
    f(float{});
}

// fn(p0, p1) on each thread's share of the m pixels.
template <typename Fn>
void over_pixels(int64_t m, Fn fn) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    fn(t, m * t / n, m * (t + 1) / n);
  }
}

// Runs sum(p0, p1, S) on every thread and leaves the total of the per-thread sums, added in
// thread order, in part[0, 2C).
template <typename Sum>
void channel_sums(int64_t m, int64_t C, std::vector<double>& part, Sum sum) {
  const auto threads = static_cast<size_t>(omp_get_max_threads());
  const auto row = static_cast<size_t>(2 * C);
  part.assign(threads * row, 0.0);
  over_pixels(m, [&](int64_t t, int64_t p0, int64_t p1) { sum(p0, p1, part.data() + static_cast<size_t>(t) * row); });
  for (size_t t = 1; t < threads; ++t)
    for (size_t c = 0; c < row; ++c) part[c] += part[t * row + c];
}

template <typename T>
const T* as(const Tensor& t) {
  return static_cast<const T*>(t.data);
}
template <typename T>
T* as_mut(const Tensor& t) {
  return static_cast<T*>(t.data);
}
float invstd_of(double var, float eps) { return static_cast<float>(1.0 / std::sqrt(var + eps)); }

}  // namespace

NhwcBatchNorm::NhwcBatchNorm(const BatchNormDesc& d) : d_(d), m_(d.batch * d.h * d.w) {
  RN_CHECK(d.layout == Layout::nhwc && (d.dtype == DType::f32 || d.dtype == DType::bf16))
      << d.str() << ": the NHWC batch-norm loops take fp32 or bf16 NHWC activations";
  RN_CHECK(!d.mixed() || (d.dtype == DType::f32 && d.half == DType::bf16))
      << d.str() << ": the NHWC batch-norm loops mix an fp32 x with bf16 y or dx only";
  const auto C = static_cast<size_t>(d.channels);
  for (auto* v : {&shift_, &scale_, &a_, &b_, &e_}) v->resize(C);
  mean_.resize(C);
  var_.resize(C);
}

std::string NhwcBatchNorm::isa() {
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
  return "x86-64";
}

void NhwcBatchNorm::sums_of_x(const Tensor& x, double* sums) {
  const int64_t C = d_.channels;
  channel_sums(m_, C, part_, [&](int64_t p0, int64_t p1, double* S) {
    if (d_.dtype == DType::bf16)
      stats64(as<bf16_t>(x), p0, p1, C, S);
    else
      stats64(as<float>(x), p0, p1, C, S);
  });
  std::copy(part_.begin(), part_.begin() + 2 * C, sums);
}

void NhwcBatchNorm::statistics(const Tensor& x) {
  const int64_t C = d_.channels;
  const bool bf16 = d_.dtype == DType::bf16;
  for (int64_t c = 0; c < C; ++c)
    shift_[static_cast<size_t>(c)] = bf16 ? load(as<bf16_t>(x), c) : load(as<float>(x), c);
  channel_sums(m_, C, part_, [&](int64_t p0, int64_t p1, double* S) {
    if (bf16)
      stats(as<bf16_t>(x), shift_.data(), p0, p1, C, S);
    else
      stats(as<float>(x), shift_.data(), p0, p1, C, S);
  });
  const double m = static_cast<double>(m_);
  for (int64_t c = 0; c < C; ++c) {
    const auto k = static_cast<size_t>(c);
    const double s = part_[k] / m;
    mean_[k] = shift_[k] + s;
    var_[k] = std::max(part_[static_cast<size_t>(C) + k] / m - s * s, 0.0);
  }
}

void NhwcBatchNorm::normalize(const Tensor& y, const Tensor& x, const Tensor* residual, const float* mean,
                              const float* invstd, const float* gamma, const float* beta) {
  const int64_t C = d_.channels;
  for (int64_t c = 0; c < C; ++c) scale_[static_cast<size_t>(c)] = gamma[c] * invstd[c];
  const bool relu = d_.fuse != BnFuse::none;
  const float* scale = scale_.data();
  with_type(y.dtype, [&]<typename Y>(Y) {
    with_type(x.dtype, [&]<typename X>(X) {
      over_pixels(m_, [&](int64_t, int64_t p0, int64_t p1) {
        normalize_range(as_mut<Y>(y), as<X>(x), residual ? as<X>(*residual) : nullptr, relu, mean, scale, beta, p0, p1,
                        C);
      });
    });
  });
}

void NhwcBatchNorm::forward_training(const Tensor& y, const Tensor& saved_mean, const Tensor& saved_invstd,
                                     const Tensor& x, const Tensor* residual, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& running_mean, const Tensor& running_var) {
  RN_CHECK(m_ > 1) << d_.str() << ": training needs more than one value per channel (N*H*W = " << m_ << ")";
  statistics(x);
  const double unbias = static_cast<double>(m_) / static_cast<double>(m_ - 1);
  const float mom = d_.momentum;
  float* mean = saved_mean.ptr<float>();
  float* invstd = saved_invstd.ptr<float>();
  float* rmean = running_mean.ptr<float>();
  float* rvar = running_var.ptr<float>();
  for (int64_t c = 0; c < d_.channels; ++c) {
    const auto k = static_cast<size_t>(c);
    mean[c] = static_cast<float>(mean_[k]);
    invstd[c] = invstd_of(var_[k], d_.eps);
    rmean[c] = (1.0f - mom) * rmean[c] + mom * mean[c];
    rvar[c] = (1.0f - mom) * rvar[c] + mom * static_cast<float>(var_[k] * unbias);
  }
  // From the saved (fp32) statistics, as forward_recompute does, so both write the same y.
  normalize(y, x, residual, mean, invstd, gamma.ptr<float>(), beta.ptr<float>());
}

void NhwcBatchNorm::forward_inference(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                      const Tensor& beta, const Tensor& running_mean, const Tensor& running_var) {
  std::vector<float> invstd(static_cast<size_t>(d_.channels));
  for (int64_t c = 0; c < d_.channels; ++c)
    invstd[static_cast<size_t>(c)] = invstd_of(running_var.ptr<float>()[c], d_.eps);
  normalize(y, x, residual, running_mean.ptr<float>(), invstd.data(), gamma.ptr<float>(), beta.ptr<float>());
}

void NhwcBatchNorm::forward_recompute(const Tensor& y, const Tensor& x, const Tensor* residual, const Tensor& gamma,
                                      const Tensor& beta, const Tensor& saved_mean, const Tensor& saved_invstd) {
  statistics(x);
  // Bits, not ==: a NaN statistic (an overflowing step that will be skipped) recomputes too.
  for (int64_t c = 0; c < d_.channels; ++c) {
    const auto k = static_cast<size_t>(c);
    RN_CHECK(
        std::bit_cast<uint32_t>(static_cast<float>(mean_[k])) == std::bit_cast<uint32_t>(saved_mean.ptr<float>()[c]) &&
        std::bit_cast<uint32_t>(invstd_of(var_[k], d_.eps)) == std::bit_cast<uint32_t>(saved_invstd.ptr<float>()[c]))
        << d_.str() << ": recomputed batch statistics of channel " << c
        << " differ from the saved ones (the input changed since forward_training)";
  }
  normalize(y, x, residual, saved_mean.ptr<float>(), saved_invstd.ptr<float>(), gamma.ptr<float>(), beta.ptr<float>());
}

const Tensor& NhwcBatchNorm::first_backward_pass(const Tensor& dx, const Tensor* dresidual, const Tensor& dy,
                                                 const Tensor& x, const Tensor& y, const float* mean, bool fp64) {
  const int64_t C = d_.channels;
  const bool fused = d_.fuse != BnFuse::none;
  // g = dy * (y > 0) goes to dresidual (add_relu: that is its value) or dx (relu), where the
  // second pass reads it (dx may be dy: each element is read before it is written).
  // Mixed dtypes (precision O1): g is exact in dresidual (x's dtype, fp32) and in dx, which
  // with the ReLU alone has y's dtype (BatchNormDesc::validate).
  const Tensor& g = !fused ? dy : dresidual != nullptr ? *dresidual : dx;
  with_type(g.dtype, [&]<typename G>(G) {
    with_type(dy.dtype, [&]<typename Y>(Y) {
      with_type(x.dtype, [&]<typename X>(X) {
        channel_sums(m_, C, part_, [&](int64_t p0, int64_t p1, double* S) {
          G* go = fused ? as_mut<G>(g) : nullptr;
          const Y* yp = fused ? as<Y>(y) : nullptr;
          if (fp64)
            grad_sums64(go, as<Y>(dy), yp, as<X>(x), mean, p0, p1, C, S);
          else
            grad_sums(go, as<Y>(dy), yp, as<X>(x), mean, p0, p1, C, S);
        });
      });
    });
  });
  return g;
}

const Tensor& NhwcBatchNorm::gradient_sums(const Tensor& dx, const Tensor* dresidual, const Tensor& dy, const Tensor& x,
                                           const Tensor& y, const float* mean, double* sums) {
  const Tensor& g = first_backward_pass(dx, dresidual, dy, x, y, mean, /*fp64=*/true);
  std::copy(part_.begin(), part_.begin() + 2 * d_.channels, sums);
  return g;
}

void NhwcBatchNorm::gradient_input(const Tensor& dx, const Tensor& g, const Tensor& x, const float* mean,
                                   const float* a, const float* b, const float* e) {
  const int64_t C = d_.channels;
  with_type(dx.dtype, [&]<typename D>(D) {
    with_type(g.dtype, [&]<typename G>(G) {
      with_type(x.dtype, [&]<typename X>(X) {
        over_pixels(m_, [&](int64_t, int64_t p0, int64_t p1) {
          grad_input(as_mut<D>(dx), as<G>(g), as<X>(x), mean, a, b, e, p0, p1, C);
        });
      });
    });
  });
}

void NhwcBatchNorm::backward(const Tensor& dx, const Tensor* dresidual, const Tensor& dgamma, const Tensor& dbeta,
                             const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                             const Tensor& saved_mean, const Tensor& saved_invstd) {
  const int64_t C = d_.channels;
  const float* mean = saved_mean.ptr<float>();
  const float* invstd = saved_invstd.ptr<float>();
  const Tensor& g = first_backward_pass(dx, dresidual, dy, x, y, mean, /*fp64=*/false);
  const double m = static_cast<double>(m_);
  for (int64_t c = 0; c < C; ++c) {
    const auto k = static_cast<size_t>(c);
    const double sum_g = part_[k], sum_gxc = part_[static_cast<size_t>(C) + k];
    const double s = invstd[c], a = static_cast<double>(gamma.ptr<float>()[c]) * s;
    dbeta.ptr<float>()[c] = static_cast<float>(dbeta.ptr<float>()[c] + sum_g);
    dgamma.ptr<float>()[c] = static_cast<float>(dgamma.ptr<float>()[c] + sum_gxc * s);
    // dx = a (g - mean(g) - xhat mean(g xhat)), xhat = (x - mean) s
    a_[k] = static_cast<float>(a);
    b_[k] = static_cast<float>(-a * s * s * sum_gxc / m);
    e_[k] = static_cast<float>(-a * sum_g / m);
  }
  gradient_input(dx, g, x, mean, a_.data(), b_.data(), e_.data());
}

}  // namespace rn::cpu

// The cpu backend's NHWC batch norm (backends/cpu/batch_norm_nhwc.h: our own loops) against
// an fp64 computation of the same formulas in this file, on shapes the cross-backend
// harness does not reach: channel counts that are no multiple of the vector width (3, 17),
// pixel counts of 429 and 1600 (more than one 128-pixel chunk per thread), and channel
// means 10^3 times the spread, where a one-pass variance without a shift loses every digit
// in fp32.
// Also: the same bits at a fixed thread count, dx written over dy, and a NaN kept to its
// channel. oneDNN's NHWC batch norm, which the backend can still be asked for, is held to the
// same formulas on a few cases.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/batch_norm_nhwc.h"
#include "backends/cpu/cpu_backend.h"
#include "ops/backend.h"

namespace rn {
namespace {

struct Case {
  int64_t n, c, h, w;
  BnFuse fuse;
  DType dtype;
  float mean, spread;  // of x, per channel: mean * (1 + c / C) +- spread
  bool loops = true;   // false: oneDNN's batch norm (CpuBackendOptions::batch_norm_loops)
};

std::string case_name(const Case& k) {
  std::ostringstream s;
  s << "n" << k.n << "c" << k.c << "_" << k.h << "x" << k.w << "_" << bn_fuse_name(k.fuse) << "_" << dtype_name(k.dtype)
    << "_mean" << (k.mean < 0 ? "m" : "") << static_cast<int>(std::fabs(k.mean)) << (k.loops ? "" : "_onednn");
  return s.str();
}
std::string name(const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); }
void PrintTo(const Case& k, std::ostream* os) { *os << case_name(k); }

// An NHWC activation tensor with its values also kept as doubles (after rounding to the dtype).
struct Act {
  HostTensor t;
  std::vector<double> v;
  Act(const Shape& s, DType dt) : t(s, dt, Layout::nhwc), v(static_cast<size_t>(s.numel())) {}
  void set(int64_t i, float f) {
    if (t.view().dtype == DType::bf16) {
      t.ptr<bf16_t>()[i] = f32_to_bf16(f);
      v[static_cast<size_t>(i)] = bf16_to_f32(t.ptr<bf16_t>()[i]);
    } else {
      t.ptr<float>()[i] = f;
      v[static_cast<size_t>(i)] = f;
    }
  }
  double get(int64_t i) const {
    return t.view().dtype == DType::bf16 ? bf16_to_f32(t.ptr<bf16_t>()[i]) : t.ptr<float>()[i];
  }
  std::vector<double> values() const {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = get(static_cast<int64_t>(i));
    return out;
  }
  std::vector<char> bytes() const {
    const char* p = static_cast<const char*>(t.view().data);
    return {p, p + t.view().bytes()};
  }
};

HostTensor channels(const std::vector<float>& v) {
  HostTensor t(Shape{static_cast<int64_t>(v.size())}, DType::f32);
  std::memcpy(t.ptr<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

// ||a - b|| / ||b||
double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
std::vector<double> as_doubles(const HostTensor& t, int64_t n) { return {t.ptr<float>(), t.ptr<float>() + n}; }

class CpuBatchNormNhwc : public ::testing::TestWithParam<Case> {};

TEST_P(CpuBatchNormNhwc, MatchesFp64Formulas) {
  const Case& k = GetParam();
  BatchNormDesc d;
  d.batch = k.n, d.channels = k.c, d.h = k.h, d.w = k.w, d.fuse = k.fuse, d.dtype = k.dtype, d.layout = Layout::nhwc;
  CpuBackendOptions options;
  options.batch_norm_loops = k.loops;
  auto backend = make_cpu_backend(options);
  std::string why;
  if (!backend->supports_dtype(k.dtype, &why)) GTEST_SKIP() << why;
  auto kernel = backend->make_batch_norm(d);
  const int64_t C = k.c, M = k.n * k.h * k.w, N = M * C;
  const Shape xs = d.x_shape();
  const bool add = k.fuse == BnFuse::add_relu, fused = k.fuse != BnFuse::none;

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.5f, 1.5f);
  Act x(xs, k.dtype), res(xs, k.dtype), y(xs, k.dtype), dy(xs, k.dtype), dx(xs, k.dtype), dres(xs, k.dtype);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t c = i % C;
    x.set(i, k.mean * (1.0f + static_cast<float>(c) / static_cast<float>(C)) + k.spread * normal(rng));
    res.set(i, normal(rng));
    dy.set(i, normal(rng));
  }
  std::vector<float> gamma(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) gamma[static_cast<size_t>(c)] = uni(rng), beta[static_cast<size_t>(c)] = uni(rng) - 1;
  HostTensor g = channels(gamma), b = channels(beta), rm = channels(std::vector<float>(C, 0.0f)),
             rv = channels(std::vector<float>(C, 1.0f)), sm = channels(std::vector<float>(C)),
             si = channels(std::vector<float>(C)), dg = channels(std::vector<float>(C, 0.5f)),
             db = channels(std::vector<float>(C, -0.5f));

  kernel->forward_training(y.t, sm, si, x.t, add ? &res.t.view() : nullptr, g, b, rm, rv);

  // Statistics in fp64 from the same (rounded) inputs.
  std::vector<double> mean(static_cast<size_t>(C)), var(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) mean[static_cast<size_t>(i % C)] += x.v[static_cast<size_t>(i)] / M;
  for (int64_t i = 0; i < N; ++i) {
    const double e = x.v[static_cast<size_t>(i)] - mean[static_cast<size_t>(i % C)];
    var[static_cast<size_t>(i % C)] += e * e / M;
  }
  std::vector<double> invstd(static_cast<size_t>(C)), rv_want(static_cast<size_t>(C)), rm_want(static_cast<size_t>(C));
  for (size_t c = 0; c < static_cast<size_t>(C); ++c) {
    invstd[c] = 1.0 / std::sqrt(var[c] + d.eps);
    rm_want[c] = 0.1 * mean[c];
    rv_want[c] = 0.9 + 0.1 * var[c] * M / (M - 1);
  }
  // fp32 statistics: relative 1e-6 (the inputs are exact; a one-pass variance of values
  // whose mean is 1000x their spread, unshifted, would be off by ~1e-1 or worse).
  EXPECT_LT(rel(as_doubles(sm, C), mean), 1e-6);
  EXPECT_LT(rel(as_doubles(si, C), invstd), 1e-5);
  EXPECT_LT(rel(as_doubles(rm, C), rm_want), 1e-6);
  EXPECT_LT(rel(as_doubles(rv, C), rv_want), 1e-5);

  // y from the kernel's own saved statistics (so that only the normalisation is measured).
  std::vector<double> y_want(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    const auto c = static_cast<size_t>(i % C);
    double z = (x.v[static_cast<size_t>(i)] - sm.ptr<float>()[c]) * si.ptr<float>()[c] * gamma[c] + beta[c];
    if (add) z += res.v[static_cast<size_t>(i)];
    y_want[static_cast<size_t>(i)] = fused && z < 0 ? 0 : z;
  }
  // fp32: a few roundings of values of order 1 (1e-6); bf16: one rounding to 8 bits (2^-9).
  const double act_tol = k.dtype == DType::bf16 ? 5e-3 : 1e-5;
  EXPECT_LT(rel(y.values(), y_want), act_tol);

  // Recompute: the same y, bit for bit; the running statistics untouched.
  Act y2(xs, k.dtype);
  const std::vector<float> rv_before(rv.ptr<float>(), rv.ptr<float>() + C);
  kernel->forward_recompute(y2.t, x.t, add ? &res.t.view() : nullptr, g, b, sm, si);
  EXPECT_EQ(y2.bytes(), y.bytes());
  EXPECT_EQ(std::vector<float>(rv.ptr<float>(), rv.ptr<float>() + C), rv_before);

  // Backward with the kernel's y (mask) and saved statistics.
  kernel->backward(dx.t, add ? &dres.t.view() : nullptr, dg, db, dy.t, x.t, y.t, g, sm, si);
  const std::vector<double> yk = y.values();
  std::vector<double> gr(static_cast<size_t>(N)), sum_g(static_cast<size_t>(C)), sum_gx(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) {
    const auto c = static_cast<size_t>(i % C), j = static_cast<size_t>(i);
    gr[j] = fused && !(yk[j] > 0) ? 0 : dy.v[j];
    sum_g[c] += gr[j];
    sum_gx[c] += gr[j] * (x.v[j] - sm.ptr<float>()[c]) * si.ptr<float>()[c];
  }
  std::vector<double> dx_want(static_cast<size_t>(N)), dg_want(static_cast<size_t>(C)), db_want(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) {
    const auto c = static_cast<size_t>(i % C), j = static_cast<size_t>(i);
    const double s = si.ptr<float>()[c], xhat = (x.v[j] - sm.ptr<float>()[c]) * s;
    dx_want[j] = gamma[c] * s * (gr[j] - sum_g[c] / M - xhat * sum_gx[c] / M);
  }
  for (size_t c = 0; c < static_cast<size_t>(C); ++c) dg_want[c] = 0.5 + sum_gx[c], db_want[c] = -0.5 + sum_g[c];
  EXPECT_LT(rel(dx.values(), dx_want), act_tol);
  if (add) {
    EXPECT_EQ(rel(dres.values(), gr), 0.0) << "dresidual is dy * (y > 0), exactly";
  }
  EXPECT_LT(rel(as_doubles(dg, C), dg_want), 1e-5);
  EXPECT_LT(rel(as_doubles(db, C), db_want), 1e-5);

  // dx written over dy: the same bits as out of place.
  Act inplace(xs, k.dtype), dres2(xs, k.dtype);
  std::memcpy(inplace.t.view().data, dy.t.view().data, dy.t.view().bytes());
  HostTensor dg2 = channels(std::vector<float>(C, 0.5f)), db2 = channels(std::vector<float>(C, -0.5f));
  kernel->backward(inplace.t, add ? &dres2.t.view() : nullptr, dg2, db2, inplace.t, x.t, y.t, g, sm, si);
  EXPECT_EQ(inplace.bytes(), dx.bytes());
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBatchNormNhwc,
                         ::testing::Values(Case{3, 17, 11, 13, BnFuse::none, DType::f32, 1000.0f, 1.0f},
                                           Case{3, 17, 11, 13, BnFuse::relu, DType::f32, 1000.0f, 1.0f},
                                           Case{3, 17, 11, 13, BnFuse::add_relu, DType::f32, 1000.0f, 1.0f},
                                           Case{2, 64, 9, 9, BnFuse::add_relu, DType::f32, 0.5f, 2.0f},
                                           Case{1, 3, 40, 40, BnFuse::relu, DType::f32, -3.0f, 0.25f},
                                           Case{3, 17, 11, 13, BnFuse::relu, DType::bf16, 100.0f, 1.0f},
                                           Case{2, 64, 9, 9, BnFuse::add_relu, DType::bf16, 0.5f, 2.0f},
                                           Case{1, 3, 40, 40, BnFuse::none, DType::bf16, -3.0f, 0.25f},
                                           // oneDNN's NHWC batch norm, still selectable for comparisons (bench/micro)
                                           Case{3, 17, 11, 13, BnFuse::add_relu, DType::f32, 0.5f, 2.0f, false},
                                           Case{2, 64, 9, 9, BnFuse::relu, DType::f32, -3.0f, 0.25f, false},
                                           Case{2, 64, 9, 9, BnFuse::add_relu, DType::bf16, 0.5f, 2.0f, false}),
                         name);

// The per-thread sums are added in thread order: at a fixed thread count every run gives the
// same bits (forward_recompute depends on it); 1 and 2 threads agree to rounding.
TEST(CpuBatchNormNhwcThreads, SameBitsAtAFixedThreadCount) {
  BatchNormDesc d;
  d.batch = 4, d.channels = 40, d.h = 9, d.w = 7, d.fuse = BnFuse::relu, d.layout = Layout::nhwc;
  const Shape xs = d.x_shape();
  HostTensor x(xs, DType::f32, Layout::nhwc);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(5.0f, 2.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = normal(rng);
  HostTensor g = channels(std::vector<float>(40, 1.0f)), b = channels(std::vector<float>(40, 0.0f));
  auto stats = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::NhwcBatchNorm k(d);
    HostTensor y(xs, DType::f32, Layout::nhwc),
        sm = channels(std::vector<float>(40)), si = channels(std::vector<float>(40)),
        rm = channels(std::vector<float>(40)), rv = channels(std::vector<float>(40));
    k.forward_training(y, sm, si, x, nullptr, g, b, rm, rv);
    omp_set_num_threads(before);
    std::vector<float> out(sm.ptr<float>(), sm.ptr<float>() + 40);
    out.insert(out.end(), si.ptr<float>(), si.ptr<float>() + 40);
    return out;
  };
  std::cout << "NHWC batch-norm loops run as " << cpu::NhwcBatchNorm::isa() << " here\n";
  const std::vector<float> two = stats(2), one = stats(1);
  EXPECT_EQ(stats(2), two);
  EXPECT_EQ(stats(1), one);
  for (size_t i = 0; i < two.size(); ++i) EXPECT_NEAR(one[i], two[i], 1e-6 * std::fabs(two[i])) << i;
}

// A NaN stays in its channel: that channel's statistics and outputs are NaN, the others are
// untouched by it.
TEST(CpuBatchNormNhwcThreads, NanStaysInItsChannel) {
  BatchNormDesc d;
  d.batch = 2, d.channels = 5, d.h = 6, d.w = 6, d.layout = Layout::nhwc;
  cpu::NhwcBatchNorm k(d);
  const Shape xs = d.x_shape();
  HostTensor x(xs, DType::f32, Layout::nhwc), y(xs, DType::f32, Layout::nhwc);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = static_cast<float>(i % 11);
  x.ptr<float>()[5 * 7 + 2] = std::nanf("");  // pixel 7, channel 2
  HostTensor g = channels(std::vector<float>(5, 1.0f)), b = channels(std::vector<float>(5, 0.0f)),
             sm = channels(std::vector<float>(5)), si = channels(std::vector<float>(5)),
             rm = channels(std::vector<float>(5)), rv = channels(std::vector<float>(5));
  k.forward_training(y, sm, si, x, nullptr, g, b, rm, rv);
  for (int64_t c = 0; c < 5; ++c) {
    EXPECT_EQ(std::isnan(sm.ptr<float>()[c]), c == 2) << c;
    for (int64_t p = 0; p < 72; ++p) EXPECT_EQ(std::isnan(y.ptr<float>()[p * 5 + c]), c == 2) << p << " " << c;
  }
}

// One rank's stats reducer: the sums stay as they are, but the synchronised passes run.
struct OneRank final : BatchStatsReducer {
  void sum(double*, int64_t) override {}
};

// Precision O1's fused casts (BatchNormDesc::half_y, half_dx): from the same fp32 x the
// kernel writes y and dx rounded to bf16 once, from the same fp32 values the all-fp32 kernel
// computes, so they are that kernel's outputs rounded, bit for bit; everything else (saved
// and running statistics, dresidual, dgamma, dbeta) is the same bits. Per rank and
// synchronised (the SyncBatchNorm's NHWC passes, one rank).
TEST(CpuBatchNormNhwcMixed, HalfYAndDxAreTheFp32OutputsRounded) {
  auto backend = make_cpu_backend(CpuBackendOptions{});
  std::string why;
  if (!backend->supports_dtype(DType::bf16, &why)) GTEST_SKIP() << why;
  ASSERT_TRUE(backend->bn_half_io(Layout::nhwc, DType::bf16));
  EXPECT_FALSE(backend->bn_half_io(Layout::nchw, DType::bf16));
  EXPECT_FALSE(backend->bn_half_io(Layout::nhwc, DType::f16));
  struct Mix {
    BnFuse fuse;
    bool half_y, half_dx;
  };
  const Mix mixes[] = {{BnFuse::none, true, true},     {BnFuse::none, false, true},    {BnFuse::none, true, false},
                       {BnFuse::relu, true, true},     {BnFuse::add_relu, true, true}, {BnFuse::add_relu, false, true},
                       {BnFuse::add_relu, true, false}};
  OneRank one_rank;
  for (const bool sync : {false, true})
    for (const Mix& mix : mixes) {
      BatchNormDesc d32;
      d32.batch = 3, d32.channels = 17, d32.h = 11, d32.w = 13, d32.fuse = mix.fuse, d32.layout = Layout::nhwc;
      BatchNormDesc d = d32;
      d.half_y = mix.half_y, d.half_dx = mix.half_dx;
      SCOPED_TRACE(d.str() + (sync ? ", synchronised" : ""));
      auto k32 = backend->make_batch_norm(d32);
      auto k = backend->make_batch_norm(d);
      if (sync) {
        k32->set_stats_reducer(&one_rank);
        k->set_stats_reducer(&one_rank);
      }
      const int64_t C = d.channels, N = d.x_shape().numel();
      const Shape xs = d.x_shape();
      const bool add = d.fuse == BnFuse::add_relu;
      std::mt19937 rng(11);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      Act x(xs, DType::f32), res(xs, DType::f32), dy32(xs, DType::f32), dy(xs, d.y_dtype());
      for (int64_t i = 0; i < N; ++i) {
        x.set(i, 3.0f + 2.0f * normal(rng));
        res.set(i, normal(rng));
        const float g = bf16_to_f32(f32_to_bf16(normal(rng)));  // exact in either dtype
        dy32.set(i, g);
        dy.set(i, g);
      }
      std::vector<float> gamma(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
      for (size_t c = 0; c < gamma.size(); ++c) gamma[c] = 0.5f + 0.05f * static_cast<float>(c), beta[c] = 0.1f;
      const HostTensor g = channels(gamma), b = channels(beta);
      struct Out {
        HostTensor sm, si, rm, rv, dg, db;
      };
      auto fresh = [&] {
        return Out{channels(std::vector<float>(C)),       channels(std::vector<float>(C)),
                   channels(std::vector<float>(C, 0.0f)), channels(std::vector<float>(C, 1.0f)),
                   channels(std::vector<float>(C, 0.5f)), channels(std::vector<float>(C, -0.5f))};
      };
      Out o32 = fresh(), o = fresh();
      Act y32(xs, DType::f32), y(xs, d.y_dtype());
      const Tensor* r = add ? &res.t.view() : nullptr;
      k32->forward_training(y32.t, o32.sm, o32.si, x.t, r, g, b, o32.rm, o32.rv);
      k->forward_training(y.t, o.sm, o.si, x.t, r, g, b, o.rm, o.rv);
      auto rounded = [&](const Act& a, DType to) {
        Act out(xs, to);
        for (int64_t i = 0; i < N; ++i) out.set(i, a.t.ptr<float>()[i]);
        return out.bytes();
      };
      auto same = [&](const HostTensor& a, const HostTensor& b2) {
        return std::memcmp(a.view().data, b2.view().data, a.view().bytes()) == 0;
      };
      EXPECT_EQ(y.bytes(), rounded(y32, d.y_dtype()));
      EXPECT_TRUE(same(o.sm, o32.sm) && same(o.si, o32.si) && same(o.rm, o32.rm) && same(o.rv, o32.rv));
      Act y_again(xs, d.y_dtype());
      k->forward_recompute(y_again.t, x.t, r, g, b, o.sm, o.si);
      EXPECT_EQ(y_again.bytes(), y.bytes());

      // Backward, each kernel with its own y: the same mask (no y here rounds to zero).
      Act dx32(xs, DType::f32), dx(xs, d.dx_dtype()), dres32(xs, DType::f32), dres(xs, DType::f32);
      k32->backward(dx32.t, add ? &dres32.t.view() : nullptr, o32.dg, o32.db, dy32.t, x.t, y32.t, g, o32.sm, o32.si);
      k->backward(dx.t, add ? &dres.t.view() : nullptr, o.dg, o.db, dy.t, x.t, y.t, g, o.sm, o.si);
      EXPECT_EQ(dx.bytes(), rounded(dx32, d.dx_dtype()));
      if (add) {
        EXPECT_EQ(dres.bytes(), dres32.bytes());
      }
      EXPECT_TRUE(same(o.dg, o32.dg) && same(o.db, o32.db));
      if (d.y_dtype() == d.dx_dtype()) {  // in place over dy, as the plan runs it
        Act inplace(xs, d.dx_dtype()), dres2(xs, DType::f32);
        std::memcpy(inplace.t.view().data, dy.t.view().data, dy.t.view().bytes());
        Out o2 = fresh();
        k->backward(inplace.t, add ? &dres2.t.view() : nullptr, o2.dg, o2.db, inplace.t, x.t, y.t, g, o.sm, o.si);
        EXPECT_EQ(inplace.bytes(), dx.bytes());
      }
    }
}

// What the loops do not take is refused when the kernel is made, with the reason.
TEST(CpuBatchNormNhwcMixed, RefusedWhereNotTaken) {
  BatchNormDesc d;
  d.batch = 2, d.channels = 8, d.h = 5, d.w = 5, d.fuse = BnFuse::relu, d.layout = Layout::nhwc, d.half_y = true;
  EXPECT_THROW(d.validate(), Error) << "relu: y and dx must share a dtype";
  d.half_dx = true;
  d.dtype = DType::bf16;
  EXPECT_THROW(d.validate(), Error) << "x must be fp32";
  d.dtype = DType::f32;
  CpuBackendOptions onednn;
  onednn.batch_norm_loops = false;
  EXPECT_FALSE(make_cpu_backend(onednn)->bn_half_io(Layout::nhwc, DType::bf16));
  EXPECT_THROW(make_cpu_backend(onednn)->make_batch_norm(d), Unsupported);
  d.layout = Layout::nchw;
  EXPECT_THROW(make_cpu_backend(CpuBackendOptions{})->make_batch_norm(d), Unsupported);
  d.layout = Layout::nhwc;
  d.half = DType::f16;
  EXPECT_THROW(make_cpu_backend(CpuBackendOptions{})->make_batch_norm(d), Unsupported);
}

}  // namespace
}  // namespace rn

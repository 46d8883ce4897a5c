// The CUDA backend's own kernels (backends/cuda/kernels.h), called directly: the 16-byte
// vector paths against the one-element paths (RN_CUDA_VECTOR_KERNELS=0) and against the
// host, the unaligned fallback against the aligned path, and the per-channel reductions
// against sums in double.
//
// Built twice. In test_ops (CudaKernels.*) they run on the GPU, and are skipped with a
// visible line without one; scripts/gpu-check.sh runs them before the op harness, so a
// kernel fault shows here first. In test_cuda_sim (CudaKernelsOnCpu.*) the same kernels run
// in the CPU emulation (backends/cuda/sim), under the address sanitizer, on every CI run.
#if defined(RN_HAVE_CUDA) || defined(RN_CUDA_SIM)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "ops/fused_math.h"

#ifdef RN_CUDA_SIM
#define CudaKernels CudaKernelsOnCpu
#endif

namespace rn::cuda {
namespace {

using namespace rn::cuda::testing;

double eps_of(DType t) { return t == DType::f32 ? 0x1p-23 : t == DType::f16 ? 0x1p-10 : 0x1p-7; }

// |got - want| <= tol[i] for every element.
::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::vector<double>& tol) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= tol[i]))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (tolerance " << tol[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

// Within `ulps` units in the last place of fp32 of the expected value, or `abs_tol`.
::testing::AssertionResult near(const std::vector<float>& got, const std::vector<double>& want, double ulps,
                                double abs_tol) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = ulps * eps_of(DType::f32) * std::fabs(want[i]) + abs_tol;
  return within(got, std::vector<float>(want.begin(), want.end()), tol);
}

struct Shape {
  int64_t M, C;
};
// Vector widths 8 and 4 (fp16/bf16, fp32), odd widths (one element at a time), a last split
// shorter than the others, ResNet-50's widest layer and more than 1024 splits' worth of rows.
const Shape kShapes[] = {{300, 64}, {513, 24}, {37, 3}, {130, 2048}, {1000, 12}, {300000, 16}};
const DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

std::string label(DType t, const Shape& s) {
  return std::string(dtype_name(t)) + " M=" + std::to_string(s.M) + " C=" + std::to_string(s.C);
}

class VectorSwitch {  // restores the process-wide setting
 public:
  explicit VectorSwitch(bool on) : was_(vector_kernels()) { set_vector_kernels(on); }
  ~VectorSwitch() { set_vector_kernels(was_); }

 private:
  bool was_;
};

TEST(CudaKernels, BatchStatisticsMatchDoubleSumsAndDoNotDependOnAlignment) {
  RN_REQUIRE_GPU();
  Rng rng(11);
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(t, s));
      const size_t n = static_cast<size_t>(s.M * s.C);
      const std::vector<float> x = random_values(t, n, rng, 3.0f, 2.0f);  // |mean| > std
      std::vector<double> mean(s.C, 0.0), var(s.C, 0.0);
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t c = 0; c < s.C; ++c) mean[c] += x[m * s.C + c];
      for (double& v : mean) v /= static_cast<double>(s.M);
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t c = 0; c < s.C; ++c) var[c] += std::pow(x[m * s.C + c] - mean[c], 2);
      for (double& v : var) v /= static_cast<double>(s.M);

      std::vector<std::vector<float>> results;  // mean, var: aligned, unaligned, one by one
      for (int variant = 0; variant < 3; ++variant) {
        VectorSwitch vs(variant < 2);
        Buf xb(t, n, variant == 1 ? 1 : 0), mb(DType::f32, s.C), vb(DType::f32, s.C),
            parts(DType::f32, static_cast<size_t>(channel_partials_floats(s.M, s.C)));
        xb.set(x);
        launch_bn_stats(mb.f(), vb.f(), xb.data(), t, s.M, s.C, parts.f(), nullptr);
        results.push_back(mb.get());
        results.push_back(vb.get());
      }
      for (int variant = 0; variant < 3; ++variant) {
        EXPECT_TRUE(near(results[2 * variant], mean, 8, 1e-7)) << "mean, variant " << variant;
        EXPECT_TRUE(near(results[2 * variant + 1], var, 16, 1e-7)) << "var, variant " << variant;
      }
      // Batch norm's recompute compares the statistics bit for bit, and its input may sit at
      // another address: the order of the sums must not depend on the alignment.
      std::string where;
      EXPECT_TRUE(same_bits(results[0], results[2], &where)) << "mean, unaligned: " << where;
      EXPECT_TRUE(same_bits(results[1], results[3], &where)) << "var, unaligned: " << where;
      // Twice the same launch: the same bits (no atomics).
      {
        Buf xb(t, n), mb(DType::f32, s.C), vb(DType::f32, s.C),
            parts(DType::f32, static_cast<size_t>(channel_partials_floats(s.M, s.C)));
        xb.set(x);
        launch_bn_stats(mb.f(), vb.f(), xb.data(), t, s.M, s.C, parts.f(), nullptr);
        EXPECT_TRUE(same_bits(mb.get(), results[0], &where)) << "mean, rerun: " << where;
        EXPECT_TRUE(same_bits(vb.get(), results[1], &where)) << "var, rerun: " << where;
      }
    }
}

TEST(CudaKernels, BatchNormApplyAndBackwardGiveTheSameBitsWithAndWithoutVectors) {
  RN_REQUIRE_GPU();
  Rng rng(12);
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      if (s.M * s.C > 1000000) continue;
      SCOPED_TRACE(label(t, s));
      const size_t n = static_cast<size_t>(s.M * s.C);
      const std::vector<float> x = random_values(t, n, rng, 0.5f), res = random_values(t, n, rng),
                               dy = random_values(t, n, rng);
      std::vector<float> mean(s.C), invstd(s.C), gamma(s.C), beta(s.C);
      std::vector<double> sdy(s.C, 0.0), sdyx(s.C, 0.0);
      for (int64_t c = 0; c < s.C; ++c) {
        mean[c] = 0.5f + 0.1f * rng.normal();
        invstd[c] = 1.0f + 0.2f * rng.uniform();
        gamma[c] = 1.0f + 0.3f * rng.normal();
        beta[c] = 0.2f * rng.normal();
      }
      // The host's view: per element, the same inline functions (ops/fused_math.h), whose
      // multiply-adds are explicit fmaf on both sides, so the bits should agree. The
      // tolerances still allow one fp32 unit of the terms and one unit of t (a multiply-add
      // rounded twice somewhere would move a value across a rounding boundary of t): a
      // failure here is a real difference, not a compiler's contraction.
      const double e32 = eps_of(DType::f32), et = eps_of(t);
      // Below fp16's smallest normal (2^-14) its steps stop shrinking: et * 2^-14 is one.
      const double tiny = t == DType::f16 ? 0x1p-14 : 0.0;
      std::vector<std::vector<float>> want(3, std::vector<float>(n));
      std::vector<std::vector<double>> tol(3, std::vector<double>(n));
      for (size_t i = 0; i < n; ++i) {
        const size_t c = i % static_cast<size_t>(s.C);
        const float v = fused::bn_apply(x[i], mean[c], invstd[c], gamma[c], beta[c]);
        want[0][i] = round_to_dtype(v, t);
        want[1][i] = round_to_dtype(fused::relu(v), t);
        want[2][i] = round_to_dtype(fused::relu(round_to_dtype(v, t) + res[i]), t);
        const double terms = std::fabs(v) + std::fabs(beta[c]);
        for (int f = 0; f < 3; ++f)
          tol[f][i] = 2 * e32 * (terms + std::fabs(want[f][i])) + et * std::max(std::fabs(static_cast<double>(want[f][i])), tiny);
        tol[2][i] += 2 * e32 * std::fabs(res[i]) + et * std::max(std::fabs(static_cast<double>(v)), tiny);
      }
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t c = 0; c < s.C; ++c) {
          const double g = dy[m * s.C + c];
          sdy[c] += g;
          sdyx[c] += g * ((static_cast<double>(x[m * s.C + c]) - mean[c]) * invstd[c]);
        }

      std::vector<std::vector<float>> got[3];  // per variant: y for fuse 0, 1, 2; sums; dx
      for (int variant = 0; variant < 3; ++variant) {
        VectorSwitch vs(variant < 2);
        const size_t off = variant == 1 ? 1 : 0;
        Buf xb(t, n, off), rb(t, n, off), yb(t, n, off), gb(t, n, off), dxb(t, n, off);
        Buf mb(DType::f32, s.C), ib(DType::f32, s.C), gab(DType::f32, s.C), bb(DType::f32, s.C),
            s1(DType::f32, s.C), s2(DType::f32, s.C), dga(DType::f32, s.C), dbe(DType::f32, s.C),
            parts(DType::f32, static_cast<size_t>(channel_partials_floats(s.M, s.C)));
        xb.set(x), rb.set(res), gb.set(dy), mb.set(mean), ib.set(invstd), gab.set(gamma), bb.set(beta);
        for (int fuse = 0; fuse < 3; ++fuse) {
          launch_bn_apply(yb.data(), xb.data(), fuse == 2 ? rb.data() : nullptr, t, s.M, s.C, mb.f(), ib.f(), false,
                          1e-5f, gab.f(), bb.f(), fuse, nullptr);
          got[variant].push_back(yb.get());
        }
        launch_bn_backward_sums(s1.f(), s2.f(), nullptr, gb.data(), nullptr, xb.data(), t, s.M, s.C, mb.f(), ib.f(),
                                parts.f(), nullptr);
        got[variant].push_back(s1.get());
        got[variant].push_back(s2.get());
        launch_bn_backward_dx(dxb.data(), gb.data(), nullptr, xb.data(), t, s.M, s.C, mb.f(), ib.f(), gab.f(), s1.f(),
                              s2.f(), dga.f(), dbe.f(), nullptr);
        got[variant].push_back(dxb.get());
        got[variant].push_back(dga.get());  // zero-initialised, so dgamma == sum_dy_xhat
      }
      std::string where;
      for (int fuse = 0; fuse < 3; ++fuse) {
        EXPECT_TRUE(within(got[0][fuse], want[fuse], tol[fuse])) << "apply, fuse " << fuse;
        EXPECT_TRUE(same_bits(got[0][fuse], got[1][fuse], &where)) << "apply unaligned, fuse " << fuse << ": " << where;
        EXPECT_TRUE(same_bits(got[0][fuse], got[2][fuse], &where)) << "apply one by one, fuse " << fuse << ": " << where;
      }
      // fp32 sums of M terms of about unit size: a few units of fp32 times sqrt(M).
      const double sum_tol = 16 * e32 * std::sqrt(static_cast<double>(s.M)) * 4;
      EXPECT_TRUE(near(got[0][3], sdy, 16, sum_tol)) << "sum dy";
      EXPECT_TRUE(near(got[0][4], sdyx, 16, sum_tol)) << "sum dy*xhat";
      EXPECT_TRUE(same_bits(got[0][3], got[1][3], &where)) << "sum dy unaligned: " << where;
      EXPECT_TRUE(same_bits(got[0][4], got[1][4], &where)) << "sum dy*xhat unaligned: " << where;
      EXPECT_TRUE(same_bits(got[0][4], got[0][6], &where)) << "dgamma += sum dy*xhat: " << where;
      // dx from each variant's own sums: equal bits where the sums are (aligned/unaligned).
      EXPECT_TRUE(same_bits(got[0][5], got[1][5], &where)) << "dx unaligned: " << where;
      std::vector<float> want_dx(n);
      std::vector<double> dx_tol(n);
      const float inv_m = static_cast<float>(1.0 / static_cast<double>(s.M));
      for (size_t i = 0; i < n; ++i) {
        const size_t c = i % static_cast<size_t>(s.C);
        const float s1 = got[0][3][c], s2 = got[0][4][c];
        const float v = fused::bn_backward_dx(dy[i], x[i], mean[c], invstd[c], gamma[c], s1, s2, inv_m);
        want_dx[i] = round_to_dtype(v, t);
        const double xhat = (x[i] - mean[c]) * invstd[c];
        const double terms = std::fabs(gamma[c] * invstd[c]) *
                             (std::fabs(dy[i]) + std::fabs(s1 * inv_m) + std::fabs(xhat * s2 * inv_m));
        dx_tol[i] = 4 * e32 * terms + et * std::max(std::fabs(static_cast<double>(v)), t == DType::f16 ? 0x1p-14 : 0.0);
      }
      EXPECT_TRUE(within(got[0][5], want_dx, dx_tol)) << "dx";
    }
}

// Synchronised batch norm's sums (the buffer the ranks all-reduce): [sum x, sum x^2, M]
// forward and [sum g, sum g*xhat, M] backward, against sums in double, on the vector and
// the one-element paths.
TEST(CudaKernels, SynchronisedBatchNormSumsMatchDoubleSums) {
  RN_REQUIRE_GPU();
  Rng rng(15);
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      if (s.M * s.C > 1000000) continue;
      SCOPED_TRACE(label(t, s));
      const size_t n = static_cast<size_t>(s.M * s.C);
      const std::vector<float> x = random_values(t, n, rng, 1.0f), g = random_values(t, n, rng);
      std::vector<float> mean(s.C), invstd(s.C);
      for (int64_t c = 0; c < s.C; ++c) mean[c] = 1.0f + 0.1f * rng.normal(), invstd[c] = 1.0f + 0.2f * rng.uniform();
      std::vector<double> want_f(2 * s.C + 1, 0.0), want_b(2 * s.C + 1, 0.0);
      double scale_f = 0, scale_b = 0;  // sums of magnitudes, for the tolerance
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t c = 0; c < s.C; ++c) {
          const double xv = x[m * s.C + c], gv = g[m * s.C + c];
          const double xhat = static_cast<double>((x[m * s.C + c] - mean[c]) * invstd[c]);
          want_f[c] += xv, want_f[s.C + c] += xv * xv;
          want_b[c] += gv, want_b[s.C + c] += gv * xhat;
          scale_f = std::max(scale_f, std::fabs(xv) + xv * xv);
          scale_b = std::max(scale_b, std::fabs(gv) * (1.0 + std::fabs(xhat)));
        }
      want_f[2 * s.C] = want_b[2 * s.C] = static_cast<double>(s.M);
      for (int variant = 0; variant < 2; ++variant) {
        VectorSwitch vs(variant == 0);
        SCOPED_TRACE(variant == 0 ? "vectors" : "one by one");
        Buf xb(t, n), gb(t, n), mb(DType::f32, s.C), ib(DType::f32, s.C),
            parts(DType::f32, static_cast<size_t>(channel_partials_floats(s.M, s.C)));
        xb.set(x), gb.set(g), mb.set(mean), ib.set(invstd);
        double* sums = nullptr;
        const size_t count = static_cast<size_t>(2 * s.C + 1);
        RN_CUDA_CHECK(cudaMalloc(&sums, count * sizeof(double)));
        for (int dir = 0; dir < 2; ++dir) {
          if (dir == 0)
            launch_bn_sync_forward_sums(sums, xb.data(), t, s.M, s.C, parts.f(), nullptr);
          else
            launch_bn_sync_backward_sums(sums, nullptr, gb.data(), nullptr, xb.data(), t, s.M, s.C, mb.f(), ib.f(),
                                         parts.f(), nullptr);
          std::vector<double> got(count);
          RN_CUDA_CHECK(cudaMemcpy(got.data(), sums, count * sizeof(double), cudaMemcpyDeviceToHost));
          const std::vector<double>& want = dir == 0 ? want_f : want_b;
          // fp32 sums within a block of rows, fp64 across: a few fp32 units of the largest
          // term times the rows a thread adds up, which 64 * sqrt(M) covers.
          const double tol = 64 * eps_of(DType::f32) * std::sqrt(static_cast<double>(s.M)) * (dir == 0 ? scale_f : scale_b);
          for (size_t i = 0; i < count; ++i)
            EXPECT_NEAR(got[i], want[i], tol) << (dir == 0 ? "forward" : "backward") << " sums, entry " << i;
        }
        cudaFree(sums);
      }
    }
}

// Batch norm fused with a ReLU masks dy by its output y inside the backward passes: the sums
// pass computes g = y > 0 ? dy : +0 as it reads dy (and, for add+ReLU, stores g into
// dresidual), the dx pass masks again (ReLU) or reads dresidual (add+ReLU). Every result must
// be the bits of the unfused sequence (launch_relu_backward, then the unmasked passes), at
// every alignment and vector width, and dresidual exactly dy*(y>0). y holds exact zeros (+0
// and -0, both masked) besides its negatives.
TEST(CudaKernels, BatchNormBackwardWithTheReluFusedGivesTheUnfusedBits) {
  RN_REQUIRE_GPU();
  Rng rng(17);
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      if (s.M * s.C > 1000000) continue;
      SCOPED_TRACE(label(t, s));
      const size_t n = static_cast<size_t>(s.M * s.C);
      const std::vector<float> x = random_values(t, n, rng, 0.5f), dy = random_values(t, n, rng);
      std::vector<float> y = random_values(t, n, rng), g(n), mean(s.C), invstd(s.C), gamma(s.C);
      for (size_t i = 0; i < n; i += 5) y[i] = i % 2 ? -0.0f : 0.0f;
      for (int64_t c = 0; c < s.C; ++c) {
        mean[c] = 0.5f + 0.1f * rng.normal();
        invstd[c] = 1.0f + 0.2f * rng.uniform();
        gamma[c] = 1.0f + 0.3f * rng.normal();
      }
      std::vector<double> sdy(s.C, 0.0), sdyx(s.C, 0.0);
      for (size_t i = 0; i < n; ++i) {
        const size_t c = i % static_cast<size_t>(s.C);
        g[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        sdy[c] += g[i];
        sdyx[c] += g[i] * ((static_cast<double>(x[i]) - mean[c]) * invstd[c]);
      }
      // 0: vectors; 1: vectors, y and dresidual one element off (the others aligned); 2: every
      // buffer one element off; 3: one element at a time.
      for (int variant = 0; variant < 4; ++variant) {
        VectorSwitch vs(variant < 3);
        SCOPED_TRACE("variant " + std::to_string(variant));
        const size_t off = variant == 2 ? 1 : 0, yoff = variant == 1 || variant == 2 ? 1 : 0;
        Buf xb(t, n, off), gb(t, n, off), yb(t, n, yoff), masked(t, n, off), dres(t, n, yoff), dx_ref(t, n, off),
            dxb(t, n, off);
        Buf mb(DType::f32, s.C), ib(DType::f32, s.C), gab(DType::f32, s.C),
            parts(DType::f32, static_cast<size_t>(channel_partials_floats(s.M, s.C)));
        std::deque<Buf> stats;  // [4k + q]: sum g, sum g*xhat, dgamma, dbeta of k = unfused, relu, add_relu
        for (int q = 0; q < 12; ++q) stats.emplace_back(DType::f32, s.C);
        xb.set(x), gb.set(dy), yb.set(y), mb.set(mean), ib.set(invstd), gab.set(gamma);
        const std::vector<float> garbage(n, 7.0f);
        auto sums = [&](int k, void* masked_dy, const void* dy_in, const void* mask) {
          launch_bn_backward_sums(stats[4 * k].f(), stats[4 * k + 1].f(), masked_dy, dy_in, mask, xb.data(), t, s.M,
                                  s.C, mb.f(), ib.f(), parts.f(), nullptr);
        };
        auto dx = [&](int k, void* out, const void* dy_in, const void* mask) {
          launch_bn_backward_dx(out, dy_in, mask, xb.data(), t, s.M, s.C, mb.f(), ib.f(), gab.f(), stats[4 * k].f(),
                                stats[4 * k + 1].f(), stats[4 * k + 2].f(), stats[4 * k + 3].f(), nullptr);
        };
        std::string where;
        // The unfused sequence, as BatchNorm's backward ran before the fusion.
        launch_relu_backward(masked.data(), gb.data(), yb.data(), t, static_cast<int64_t>(n), nullptr);
        sums(0, nullptr, masked.data(), nullptr);
        dx(0, dx_ref.data(), masked.data(), nullptr);
        EXPECT_TRUE(same_bits(masked.get(), g, &where)) << "relu backward: " << where;
        // ReLU: masked in both passes, nothing stored.
        sums(1, nullptr, gb.data(), yb.data());
        dx(1, dxb.data(), gb.data(), yb.data());
        EXPECT_TRUE(same_bits(dxb.get(), dx_ref.get(), &where)) << "relu dx: " << where;
        // In place (dx is dy), the batch norm's contract.
        dxb.set(dy);
        launch_bn_backward_dx(dxb.data(), dxb.data(), yb.data(), xb.data(), t, s.M, s.C, mb.f(), ib.f(), gab.f(),
                              stats[4].f(), stats[5].f(), nullptr, nullptr, nullptr);
        EXPECT_TRUE(same_bits(dxb.get(), dx_ref.get(), &where)) << "relu dx in place: " << where;
        // add+ReLU: g stored into dresidual (which starts as garbage), dx from it unmasked.
        dres.set(garbage);
        sums(2, dres.data(), gb.data(), yb.data());
        EXPECT_TRUE(same_bits(dres.get(), g, &where)) << "dresidual: " << where;
        dx(2, dxb.data(), dres.data(), nullptr);
        EXPECT_TRUE(same_bits(dxb.get(), dx_ref.get(), &where)) << "add_relu dx: " << where;
        EXPECT_TRUE(same_bits(gb.get(), dy, &where)) << "dy changed: " << where;
        for (int k = 1; k < 3; ++k)
          for (int q = 0; q < 4; ++q)
            EXPECT_TRUE(same_bits(stats[4 * k + q].get(), stats[q].get(), &where))
                << (k == 1 ? "relu" : "add_relu") << ", sum/gradient " << q << ": " << where;
        // The unfused sums against sums in double, as in the test above.
        const double sum_tol = 16 * eps_of(DType::f32) * std::sqrt(static_cast<double>(s.M)) * 4;
        EXPECT_TRUE(near(stats[0].get(), sdy, 16, sum_tol)) << "sum g";
        EXPECT_TRUE(near(stats[1].get(), sdyx, 16, sum_tol)) << "sum g*xhat";

        // Synchronised batch norm's sums: the same bits masked as unmasked from the masked copy.
        const size_t count = static_cast<size_t>(2 * s.C + 1);
        std::vector<std::vector<double>> got(3, std::vector<double>(count));
        double* dsums = nullptr;
        RN_CUDA_CHECK(cudaMalloc(&dsums, count * sizeof(double)));
        dres.set(garbage);
        for (int k = 0; k < 3; ++k) {
          launch_bn_sync_backward_sums(dsums, k == 2 ? dres.data() : nullptr, k == 0 ? masked.data() : gb.data(),
                                       k == 0 ? nullptr : yb.data(), xb.data(), t, s.M, s.C, mb.f(), ib.f(), parts.f(),
                                       nullptr);
          RN_CUDA_CHECK(cudaMemcpy(got[k].data(), dsums, count * sizeof(double), cudaMemcpyDeviceToHost));
        }
        cudaFree(dsums);
        EXPECT_TRUE(same_bits(dres.get(), g, &where)) << "synchronised, dresidual: " << where;
        for (int k = 1; k < 3; ++k)
          EXPECT_EQ(0, std::memcmp(got[k].data(), got[0].data(), count * sizeof(double)))
              << "synchronised sums, " << (k == 1 ? "relu" : "add_relu");
      }
    }
}

TEST(CudaKernels, ElementwiseKernelsAreExactWithAndWithoutVectors) {
  RN_REQUIRE_GPU();
  Rng rng(13);
  for (DType t : kTypes)
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{1} << 20}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n));
      const std::vector<float> a = random_values(t, n, rng), b = random_values(t, n, rng);
      std::vector<float> relu(n), add(n), relu_bwd(n), acc(n), half(n);
      for (size_t i = 0; i < n; ++i) {
        relu[i] = fused::relu(a[i]);
        add[i] = round_to_dtype(a[i] + b[i], t);
        relu_bwd[i] = b[i] > 0.0f ? a[i] : 0.0f;  // dy = a, y = b
        acc[i] = 0.25f + a[i];
        half[i] = round_to_dtype(a[i], DType::f16);
      }
      for (int variant = 0; variant < 3; ++variant) {
        VectorSwitch vs(variant < 2);
        const size_t off = variant == 1 ? 1 : 0;
        SCOPED_TRACE(variant == 0 ? "vectors" : variant == 1 ? "unaligned" : "one by one");
        Buf ab(t, n, off), bb(t, n, off), yb(t, n, off), fb(DType::f32, n, off), hb(DType::f16, n, off);
        ab.set(a), bb.set(b);
        std::string where;
        launch_relu_forward(yb.data(), ab.data(), t, static_cast<int64_t>(n), nullptr);
        EXPECT_TRUE(same_bits(yb.get(), relu, &where)) << "relu: " << where;
        launch_add(yb.data(), ab.data(), bb.data(), t, static_cast<int64_t>(n), nullptr);
        EXPECT_TRUE(same_bits(yb.get(), add, &where)) << "add: " << where;
        launch_relu_backward(yb.data(), ab.data(), bb.data(), t, static_cast<int64_t>(n), nullptr);
        EXPECT_TRUE(same_bits(yb.get(), relu_bwd, &where)) << "relu backward: " << where;
        fb.set(std::vector<float>(n, 0.25f));
        launch_accumulate(fb.f(), ab.data(), t, static_cast<int64_t>(n), nullptr);
        EXPECT_TRUE(same_bits(fb.get(), acc, &where)) << "accumulate: " << where;
        launch_cast(hb.data(), DType::f16, ab.data(), t, static_cast<int64_t>(n), nullptr);
        EXPECT_TRUE(same_bits(hb.get(), half, &where)) << "cast to fp16: " << where;
      }
    }
}

// A NaN stays NaN through the ReLU, as in PyTorch and oneDNN: mapped to 0, a model gone NaN
// trained on with finite losses on the GPU while the CPU build stopped as diverged.
TEST(CudaKernels, ReluKeepsANaN) {
  RN_REQUIRE_GPU();
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    Buf xb(t, 4, 0), yb(t, 4, 0);
    xb.set({std::nanf(""), -1.0f, 2.0f, -std::numeric_limits<float>::infinity()});
    launch_relu_forward(yb.data(), xb.data(), t, 4, nullptr);
    const std::vector<float> y = yb.get();
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], 0.0f);
    EXPECT_EQ(y[2], 2.0f);
    EXPECT_EQ(y[3], 0.0f);
  }
}

TEST(CudaKernels, MaxPoolingMatchesTheHost) {
  RN_REQUIRE_GPU();
  Rng rng(14);
  const int64_t N = 3, C = 5, H = 11, W = 9, k = 3, stride = 2, pad = 1;
  const int64_t P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> x = random_values(t, N * H * W * C, rng), dy = random_values(t, N * P * Q * C, rng);
    std::vector<float> y(N * P * Q * C), dx(N * H * W * C, 0.0f);
    std::vector<double> dx_tol(dx.size(), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q)
          for (int64_t c = 0; c < C; ++c) {
            float best = -INFINITY;
            int64_t at = -1;
            for (int64_t r = 0; r < k; ++r)
              for (int64_t s = 0; s < k; ++s) {
                const int64_t h = p * stride - pad + r, w = q * stride - pad + s;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                const float v = x[((n * H + h) * W + w) * C + c];
                if (at < 0 || v > best) best = v, at = (n * H + h) * W + w;
              }
            const int64_t o = ((n * P + p) * Q + q) * C + c;
            y[o] = best;
            dx[at * C + c] += dy[o];
            dx_tol[at * C + c] += 2 * eps_of(DType::f32) * std::fabs(dy[o]);
          }
    for (size_t i = 0; i < dx.size(); ++i) {
      dx[i] = round_to_dtype(dx[i], t);
      dx_tol[i] += eps_of(t) * std::max(std::fabs(static_cast<double>(dx[i])), t == DType::f16 ? 0x1p-14 : 0.0);
    }
    Buf xb(t, x.size()), yb(t, y.size()), gb(t, dy.size()), dxb(t, dx.size());
    int32_t* argmax = nullptr;
    RN_CUDA_CHECK(cudaMalloc(&argmax, y.size() * sizeof(int32_t)));
    xb.set(x), gb.set(dy);
    launch_max_pool_forward(yb.data(), argmax, xb.data(), t, N, C, H, W, P, Q, k, stride, pad, nullptr);
    launch_max_pool_backward(dxb.data(), gb.data(), argmax, t, N, C, H, W, P, Q, k, stride, pad, nullptr);
    std::string where;
    EXPECT_TRUE(same_bits(yb.get(), y, &where)) << "forward: " << where;
    // At most four windows overlap an input at stride 2: sums of up to four values, in an
    // order that may differ from the host's.
    EXPECT_TRUE(within(dxb.get(), dx, dx_tol)) << "backward";
    cudaFree(argmax);
  }
}

// The weight layout kernels of every convolution call (PyTorch's KCRS to cuDNN's KRSC, and
// the KRSC gradient added into the fp32 KCRS one) and the linear layer's bias kernels.
TEST(CudaKernels, WeightLayoutAndBiasKernelsMatchTheHost) {
  RN_REQUIRE_GPU();
  Rng rng(16);
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t K = 5, C = 6, R = 3, S = 2, n = K * C * R * S;
    const std::vector<float> w = random_values(t, static_cast<size_t>(n), rng);
    std::vector<float> krsc(static_cast<size_t>(n)), acc(static_cast<size_t>(n));
    const std::vector<float> base = random_values(DType::f32, static_cast<size_t>(n), rng);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t q = 0; q < S; ++q) {
            const int64_t kcrs = ((k * C + c) * R + r) * S + q, at = ((k * R + r) * S + q) * C + c;
            krsc[at] = w[kcrs];
            acc[kcrs] = base[kcrs] + w[at];  // w read as a KRSC gradient
          }
    Buf src(t, w.size()), dst(t, w.size()), accb(DType::f32, w.size());
    src.set(w), accb.set(base);
    launch_kcrs_to_krsc(dst.data(), src.data(), t, K, C, R, S, nullptr);
    launch_accumulate_krsc_to_kcrs(accb.f(), src.data(), t, K, C, R, S, nullptr);
    std::string where;
    EXPECT_TRUE(same_bits(dst.get(), krsc, &where)) << "KCRS to KRSC: " << where;
    EXPECT_TRUE(same_bits(accb.get(), acc, &where)) << "KRSC gradient into KCRS: " << where;

    for (const Shape& sh : {Shape{7, 10}, Shape{300, 16}, Shape{130, 2048}}) {
      SCOPED_TRACE(label(t, sh));
      const auto m = static_cast<size_t>(sh.M * sh.C);
      const std::vector<float> y = random_values(t, m, rng), b = random_values(DType::f32, sh.C, rng),
                               dy = random_values(t, m, rng);
      std::vector<float> want_y(m);
      std::vector<double> want_db(sh.C, 0.0);
      for (size_t i = 0; i < m; ++i) {
        want_y[i] = round_to_dtype(y[i] + b[i % sh.C], t);
        want_db[i % sh.C] += dy[i];
      }
      for (int64_t c = 0; c < sh.C; ++c) want_db[c] += 1.0;  // db starts at 1: the kernel adds
      Buf yb(t, m), bb(DType::f32, sh.C), gb(t, m), db(DType::f32, sh.C),
          parts(DType::f32, static_cast<size_t>(channel_partials_floats(sh.M, sh.C)));
      yb.set(y), bb.set(b), gb.set(dy), db.set(std::vector<float>(sh.C, 1.0f));
      launch_bias_add(yb.data(), bb.f(), t, sh.M, sh.C, nullptr);
      launch_bias_grad(db.f(), gb.data(), t, sh.M, sh.C, parts.f(), nullptr);
      EXPECT_TRUE(same_bits(yb.get(), want_y, &where)) << "bias add: " << where;
      EXPECT_TRUE(near(db.get(), want_db, 16, 16 * eps_of(DType::f32) * std::sqrt(static_cast<double>(sh.M))))
          << "bias gradient";
    }
  }
}

}  // namespace
}  // namespace rn::cuda
#endif  // RN_HAVE_CUDA || RN_CUDA_SIM

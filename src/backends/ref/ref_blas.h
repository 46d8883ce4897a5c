// Private to the reference backend: the two loop nests that conv2d and linear are built
// from, float inputs with fp64 accumulators. A product of two floats is exact in double,
// so these round only when the caller stores the result. Summation order depends only on
// the sizes passed in.
#pragma once

#include <cstdint>

namespace rn::ref {

constexpr int64_t kRows = 4;    // output rows per micro-kernel call
constexpr int64_t kTile = 256;  // output columns per micro-kernel call (4 x 256 doubles = 8 KiB)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// acc[i * ldacc + t] += sum_{j < depth} a[i * a_row + j * a_col] * b[j * ldb + t]
// for i < rows (<= kRows) and t < cols. The t loop has no reduction, so it vectorises
// without reassociating anything.
inline void gemm_accumulate(double* acc, int64_t ldacc, int64_t rows, int64_t cols, int64_t depth, const float* a,
                            int64_t a_row, int64_t a_col, const float* b, int64_t ldb) {
  if (rows == 4) {
    double* __restrict c0 = acc;
    double* __restrict c1 = acc + ldacc;
    double* __restrict c2 = acc + 2 * ldacc;
    double* __restrict c3 = acc + 3 * ldacc;
    for (int64_t j = 0; j < depth; ++j) {
      const float* __restrict br = b + j * ldb;
      const double a0 = a[j * a_col], a1 = a[a_row + j * a_col], a2 = a[2 * a_row + j * a_col],
                   a3 = a[3 * a_row + j * a_col];
      for (int64_t t = 0; t < cols; ++t) {
        const double bt = br[t];
        c0[t] += a0 * bt;
        c1[t] += a1 * bt;
        c2[t] += a2 * bt;
        c3[t] += a3 * bt;
      }
    }
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    double* __restrict c = acc + i * ldacc;
    for (int64_t j = 0; j < depth; ++j) {
      const float* __restrict br = b + j * ldb;
      const double ai = a[i * a_row + j * a_col];
      for (int64_t t = 0; t < cols; ++t) c[t] += ai * static_cast<double>(br[t]);
    }
  }
}

// out[i] += sum_{t < n} a[t] * b[i * ldb + t] for i < rows (<= 4), with four partial sums
// per row so that the loop vectorises (a fixed, shape-only summation order).
inline void dot_rows_accumulate(double* out, int64_t rows, const float* a, const float* b, int64_t ldb, int64_t n) {
  constexpr int64_t kLanes = 4;
  double part[4][kLanes] = {};
  const int64_t n_main = n / kLanes * kLanes;
  for (int64_t i = 0; i < rows; ++i) {
    const float* __restrict bi = b + i * ldb;
    double* __restrict pi = part[i];
    for (int64_t t = 0; t < n_main; t += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) pi[l] += static_cast<double>(a[t + l]) * bi[t + l];
    }
    double s = 0.0;
    for (int64_t t = n_main; t < n; ++t) s += static_cast<double>(a[t]) * bi[t];
    out[i] += (pi[0] + pi[1]) + (pi[2] + pi[3]) + s;
  }
}

}  // namespace rn::ref

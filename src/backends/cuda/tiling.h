// How the CUDA backend's per-channel kernels divide an NHWC activation (M rows of C channels)
// among blocks and threads, and how wide their memory accesses are. Host-device functions
// without CUDA types, so the CPU tests check that every (row, channel) is visited exactly
// once (tests/ops/tiling_test.cpp) on machines without a GPU.
//
// A thread owns one vector of `vec` consecutive channels (16 bytes when C and the pointers
// allow) and walks the rows of its block's split; its per-channel parameters (mean, invstd,
// gamma, beta) stay in registers and no per-element index arithmetic is needed. Within a
// block, `tc` threads cover consecutive vectors of a row and `tr` rows are read at once, so
// a warp reads contiguous memory. Reductions combine a block's `tr` row-threads by a tree in
// a fixed order and the splits in a fixed order: the same bits on every run.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "ops/fused_math.h"  // RN_HD

namespace rn::cuda {

inline constexpr int kTileThreads = 256;

// Whether every pointer (null ones aside: an absent residual) is aligned to `bytes`.
inline bool aligned_to(std::initializer_list<const void*> ptrs, int bytes) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) != 0) return false;
  return true;
}

// The widest vector of `elem_bytes`-byte elements, at most 16 bytes, whose length divides
// `unit` (C for per-channel kernels; flat kernels, which finish the tail one by one, use
// flat_vector_elems) and to whose size every pointer is aligned. `allowed` false
// (RN_CUDA_VECTOR_KERNELS=0): 1.
inline int vector_elems(int elem_bytes, int64_t unit, std::initializer_list<const void*> ptrs, bool allowed = true) {
  if (!allowed || elem_bytes <= 0 || elem_bytes > 16) return 1;
  for (int v = 16 / elem_bytes; v > 1; v /= 2)
    if (unit % v == 0 && aligned_to(ptrs, v * elem_bytes)) return v;
  return 1;
}

// The vector width of a flat kernel (any n: the tail goes one element at a time): the widest
// to whose size every pointer is aligned.
inline int flat_vector_elems(int elem_bytes, std::initializer_list<const void*> ptrs, bool allowed = true) {
  return vector_elems(elem_bytes, 16, ptrs, allowed);
}

// Rows per split: at least 64, doubled until there are at most 1024 splits. Short splits
// give the small late layers of ResNet-50 enough blocks (14x14 and 7x7 at batch 256: 784 and
// 196 splits per column of blocks). It depends on M alone, so the scratch for the partial
// sums does not depend on the vector width.
struct RowSplits {
  int64_t splits, rows_per_split;
};
RN_HD inline RowSplits row_splits(int64_t M) {
  int64_t rows = 64;
  while ((M + rows - 1) / rows > 1024) rows *= 2;
  return {(M + rows - 1) / rows, rows};
}

struct ChannelTiling {
  int64_t M = 0, C = 0;
  int vec = 1;             // channels per access
  int64_t groups = 0;      // C / vec vectors per row
  int tc = 1, tr = 1;      // threads per block along vectors and along rows; tc * tr == kTileThreads
  int64_t blocks_x = 0;    // grid x: ceil(groups / tc)
  int64_t splits = 0;      // grid y
  int64_t rows_per_split = 0;

  // The vector that thread t of block column bx owns, or -1 for an idle thread.
  RN_HD int64_t group(int64_t bx, int t) const {
    const int64_t g = bx * tc + t % tc;
    return g < groups ? g : -1;
  }
  // Thread t of split `by` visits rows row_begin, row_begin + tr, ... below row_end.
  RN_HD int64_t row_begin(int64_t by, int t) const { return by * rows_per_split + t / tc; }
  RN_HD int64_t row_end(int64_t by) const {
    const int64_t e = (by + 1) * rows_per_split;
    return e < M ? e : M;
  }
  // How many rows that is (a counted loop lets the compiler keep several loads in flight).
  RN_HD int64_t row_count(int64_t by, int t) const {
    const int64_t b = row_begin(by, t), e = row_end(by);
    return b < e ? (e - b + tr - 1) / tr : 0;
  }
};

// vec must divide C. tc is the largest power of two not above min(C / vec, 32), so tr is a
// power of two too (the reduction tree halves it).
RN_HD inline ChannelTiling channel_tiling(int64_t M, int64_t C, int vec) {
  ChannelTiling t;
  t.M = M;
  t.C = C;
  t.vec = vec;
  t.groups = C / vec;
  const int64_t cap = t.groups < 32 ? t.groups : 32;
  t.tc = 1;
  while (t.tc * 2 <= cap) t.tc *= 2;
  t.tr = kTileThreads / t.tc;
  t.blocks_x = (t.groups + t.tc - 1) / t.tc;
  const RowSplits rs = row_splits(M);
  t.splits = rs.splits;
  t.rows_per_split = rs.rows_per_split;
  return t;
}

}  // namespace rn::cuda

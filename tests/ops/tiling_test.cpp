// The CUDA backend's work division (backends/cuda/tiling.h), checked on the CPU: every
// (row, channel) of an NHWC activation is visited exactly once, by a thread that owns its
// channel vector, and the vector width follows C and the addresses.
#include "backends/cuda/tiling.h"

#include <gtest/gtest.h>

#include <vector>

namespace rn::cuda {
namespace {

// Walks the grid as the kernels do and counts the visits of each element.
std::vector<int> visits(const ChannelTiling& t) {
  std::vector<int> count(static_cast<size_t>(t.M * t.C), 0);
  for (int64_t by = 0; by < t.splits; ++by)
    for (int64_t bx = 0; bx < t.blocks_x; ++bx)
      for (int th = 0; th < kTileThreads; ++th) {
        const int64_t g = t.group(bx, th);
        if (g < 0) continue;
        // The kernels' counted loop: row_count rows from row_begin, tr apart.
        int64_t walked = 0;
        for (int64_t m = t.row_begin(by, th); m < t.row_end(by); m += t.tr) ++walked;
        EXPECT_EQ(walked, t.row_count(by, th)) << "block " << bx << "," << by << " thread " << th;
        for (int64_t i = 0; i < t.row_count(by, th); ++i) {
          const int64_t m = t.row_begin(by, th) + i * t.tr;
          for (int k = 0; k < t.vec; ++k) count[static_cast<size_t>(m * t.C + g * t.vec + k)]++;
        }
      }
  return count;
}

TEST(ChannelTiling, EveryRowAndChannelIsVisitedOnce) {
  struct Shape {
    int64_t M, C;
    int vec;
  };
  // ResNet-50's widths at fp16 (8 per vector) and fp32 (4), odd widths one by one, row
  // counts that leave a short last split, and more than 1024 splits' worth of rows.
  const Shape shapes[] = {{1, 1, 1},     {7, 3, 1},     {300, 64, 8},   {513, 24, 8},  {1000, 2048, 8},
                          {257, 10, 1},  {4096, 12, 4}, {50, 1000, 4},  {2, 8, 8},     {300000, 16, 8},
                          {96, 48, 2},   {65, 256, 4},  {1025, 5, 1},   {700, 40, 8},  {3, 2048, 4}};
  for (const Shape& s : shapes) {
    const ChannelTiling t = channel_tiling(s.M, s.C, s.vec);
    SCOPED_TRACE("M=" + std::to_string(s.M) + " C=" + std::to_string(s.C) + " vec=" + std::to_string(s.vec));
    EXPECT_EQ(t.tc * t.tr, kTileThreads);
    EXPECT_EQ(t.tr & (t.tr - 1), 0) << "the reduction tree needs a power of two";
    EXPECT_LE(t.tc, 32);
    EXPECT_LE(t.splits, 1024);
    EXPECT_GE(t.rows_per_split, 64);
    EXPECT_EQ(t.splits, row_splits(s.M).splits) << "the partials' scratch is sized from M alone";
    const std::vector<int> count = visits(t);
    int64_t wrong = 0;
    for (int c : count) wrong += c != 1;
    EXPECT_EQ(wrong, 0) << "elements visited other than once";
  }
}

TEST(ChannelTiling, AWarpReadsContiguousMemoryWhenABlockSpansWholeRows) {
  // C = 64 at fp16: 8 vectors of 16 bytes make a 128-byte row; a warp's 32 threads read
  // 4 consecutive rows, 512 contiguous bytes.
  const ChannelTiling t = channel_tiling(4096, 64, 8);
  EXPECT_EQ(t.tc, 8);
  EXPECT_EQ(t.tr, 32);
  int64_t prev = -1;
  for (int th = 0; th < 32; ++th) {
    const int64_t at = t.row_begin(0, th) * t.C + t.group(0, th) * t.vec;
    if (prev >= 0) {
      EXPECT_EQ(at, prev + t.vec) << "thread " << th;
    }
    prev = at;
  }
}

TEST(VectorElems, FollowsTheUnitTheAlignmentAndTheSwitch) {
  alignas(64) static char buf[256];
  EXPECT_EQ(vector_elems(2, 64, {buf, buf + 16}), 8);
  EXPECT_EQ(vector_elems(4, 64, {buf}), 4);
  EXPECT_EQ(vector_elems(2, 64, {buf, buf + 8}), 4) << "8-byte aligned: 4 halves";
  EXPECT_EQ(vector_elems(2, 12, {buf}), 4) << "12 channels: vectors of 4";
  EXPECT_EQ(vector_elems(2, 3, {buf}), 1);
  EXPECT_EQ(vector_elems(2, 64, {buf + 2}), 1);
  EXPECT_EQ(vector_elems(2, 64, {buf, nullptr}), 8) << "an absent pointer (no residual) does not count";
  EXPECT_EQ(vector_elems(2, 64, {buf}, false), 1) << "RN_CUDA_VECTOR_KERNELS=0";
  EXPECT_EQ(vector_elems(8, 64, {buf}), 2);
}

TEST(VectorElems, FlatKernelsUseTheWidestAlignedVectorWhateverTheLength) {
  alignas(64) static char buf[256];
  EXPECT_EQ(flat_vector_elems(2, {buf, buf + 32, buf + 64}), 8) << "fp16 relu, add: 16 bytes";
  EXPECT_EQ(flat_vector_elems(4, {buf}), 4);
  EXPECT_EQ(flat_vector_elems(2, {buf, buf + 2}), 1) << "one pointer off by an element";
  EXPECT_EQ(flat_vector_elems(2, {buf}, false), 1) << "RN_CUDA_VECTOR_KERNELS=0";
}

TEST(RowSplits, LateLayersOfResNet50GetEnoughBlocks) {
  // Batch 256: 14x14 and 7x7 activations.
  EXPECT_GE(row_splits(256 * 14 * 14).splits, 512);
  EXPECT_GE(row_splits(256 * 7 * 7).splits, 128);
  EXPECT_LE(row_splits(256 * 112 * 112).splits, 1024);
}

}  // namespace
}  // namespace rn::cuda

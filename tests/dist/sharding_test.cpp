// The training sampler deals an epoch out so that W ranks with batch B see, step by step,
// the same global batches as one rank with batch W*B: what makes a data-parallel run match a
// single-process run, and lets a run resume on another number of ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/sampler.h"

namespace rn {
namespace {

TEST(Sharding, RanksTogetherSeeTheSingleRankGlobalBatches) {
  const int64_t size = 1003, B = 8;
  for (int W : {1, 2, 3, 4}) {
    std::vector<std::vector<int64_t>> per_rank;
    for (int r = 0; r < W; ++r) per_rank.push_back(epoch_indices(size, 42, 3, true, ShardSpec{r, W, true}));
    const std::vector<int64_t> one = epoch_indices(size, 42, 3, true, ShardSpec{0, 1, true});
    const int64_t steps = static_cast<int64_t>(per_rank[0].size()) / B;
    EXPECT_EQ(steps, size / (W * B));
    for (int64_t k = 0; k < steps; ++k) {
      std::multiset<int64_t> global, single;
      for (int r = 0; r < W; ++r)
        global.insert(per_rank[static_cast<size_t>(r)].begin() + k * B, per_rank[static_cast<size_t>(r)].begin() + (k + 1) * B);
      single.insert(one.begin() + k * W * B, one.begin() + (k + 1) * W * B);
      ASSERT_EQ(global, single) << "step " << k << " with " << W << " ranks";
    }
  }
}

TEST(Sharding, TrainingShardsAreDisjointAndEvaluationSlicesCoverEverything) {
  const int64_t size = 100;
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r)
    for (int64_t i : epoch_indices(size, 1, 0, true, ShardSpec{r, 3, true})) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_EQ(seen.size(), 99u);  // floor(100 / 3) each
  seen.clear();
  for (int r = 0; r < 3; ++r)
    for (int64_t i : epoch_indices(size, 1, 0, false, ShardSpec{r, 3, false})) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_EQ(seen.size(), 100u);
}

}  // namespace
}  // namespace rn

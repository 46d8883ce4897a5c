// The order in which one rank visits a dataset in one epoch. The whole dataset is permuted
// with a stream seeded by (seed, epoch), the same on every rank, then split into one slice
// per rank, so ranks see disjoint samples and the epoch order is reproducible from the seed
// alone (what exact resume needs).
#pragma once

#include <cstdint>
#include <vector>

namespace rn {

struct ShardSpec {
  int rank = 0;
  int world_size = 1;
  // true: every rank gets floor(size / world_size) samples (equal step counts, which data-
  // parallel training needs; the remainder, different each shuffled epoch, is left out).
  // false: the slices cover every sample and differ in size by at most one (evaluation).
  bool equal = true;
};

// The permutation of [0, size) for `epoch` (identity when !shuffle).
std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch, bool shuffle);

// [begin, end) of rank `shard.rank`'s slice of a permuted epoch of `size` samples.
void shard_range(int64_t size, const ShardSpec& shard, int64_t* begin, int64_t* end);

// The dataset indices, in visiting order, that rank `shard.rank` loads in `epoch`.
std::vector<int64_t> epoch_indices(int64_t size, uint64_t seed, int64_t epoch, bool shuffle, const ShardSpec& shard);

}  // namespace rn

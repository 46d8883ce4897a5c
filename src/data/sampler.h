// The order in which one rank visits a dataset in one epoch. The whole dataset is permuted
// with a stream seeded by (seed, epoch), the same on every rank, then shared out among the
// ranks, so ranks see disjoint samples and the epoch order is reproducible from the seed
// alone (what exact resume needs).
//
// Training (ShardSpec::equal) deals the permutation out like cards: rank r takes positions
// r, r + W, r + 2W, ... So with batch B per rank, global step k consumes exactly positions
// [k*W*B, (k+1)*W*B) of the permutation whatever W is: W ranks with batch B see the same
// global batches as one rank with batch W*B, and a run resumes on a different number of
// ranks (same global batch) exactly where it stopped. Evaluation (!equal) takes contiguous
// slices.
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

// How many samples rank `shard.rank` gets (end - begin), and for !equal the slice [begin, end)
// of the permutation it takes; for equal the rank takes positions rank + i * world_size.
void shard_range(int64_t size, const ShardSpec& shard, int64_t* begin, int64_t* end);

// The dataset indices, in visiting order, that rank `shard.rank` loads in `epoch`.
std::vector<int64_t> epoch_indices(int64_t size, uint64_t seed, int64_t epoch, bool shuffle, const ShardSpec& shard);

}  // namespace rn

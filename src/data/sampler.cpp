#include "data/sampler.h"

#include <utility>

#include "core/check.h"
#include "core/rng.h"

namespace rn {

std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch, bool shuffle) {
  RN_CHECK(size >= 0) << "negative dataset size " << size;
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;
  constexpr uint64_t kShuffleTag = 0x53687566666c65ull;  // "Shuffle"
  Rng rng = Rng(seed).fork(kShuffleTag).fork(static_cast<uint64_t>(epoch));
  for (int64_t i = size - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

void shard_range(int64_t size, const ShardSpec& shard, int64_t* begin, int64_t* end) {
  RN_CHECK(shard.world_size >= 1) << "world_size " << shard.world_size;
  RN_CHECK(shard.rank >= 0 && shard.rank < shard.world_size) << "rank " << shard.rank << " of " << shard.world_size;
  const int64_t w = shard.world_size, r = shard.rank;
  if (shard.equal) {
    const int64_t per_rank = size / w;
    *begin = r * per_rank;
    *end = *begin + per_rank;
  } else {
    *begin = size * r / w;
    *end = size * (r + 1) / w;
  }
}

std::vector<int64_t> epoch_indices(int64_t size, uint64_t seed, int64_t epoch, bool shuffle, const ShardSpec& shard) {
  int64_t begin = 0, end = 0;
  shard_range(size, shard, &begin, &end);
  std::vector<int64_t> order = epoch_permutation(size, seed, epoch, shuffle);
  if (begin == 0 && end == size) return order;
  if (!shard.equal) return std::vector<int64_t>(order.begin() + begin, order.begin() + end);
  std::vector<int64_t> mine(static_cast<size_t>(end - begin));
  for (int64_t i = 0; i < end - begin; ++i)
    mine[static_cast<size_t>(i)] = order[static_cast<size_t>(i * shard.world_size + shard.rank)];
  return mine;
}

}  // namespace rn

#include "data/image_cache.h"

#include "core/check.h"

namespace rn {

DecodedCache::DecodedCache(int64_t num_images, size_t capacity_bytes, int short_side)
    : slots_(static_cast<size_t>(num_images)), capacity_(capacity_bytes), short_side_(short_side) {
  RN_CHECK(num_images >= 0) << "cache for " << num_images << " images";
  RN_CHECK(short_side > 0) << "cache short side " << short_side << " must be positive";
  for (auto& s : slots_) s.store(nullptr, std::memory_order_relaxed);
}

DecodedCache::~DecodedCache() {
  for (auto& s : slots_) delete s.load(std::memory_order_relaxed);
}

const CachedImage* DecodedCache::find(int64_t index) const {
  RN_CHECK(index >= 0 && index < size()) << "cache index " << index << " outside [0, " << size() << ")";
  return slots_[static_cast<size_t>(index)].load(std::memory_order_acquire);
}

const CachedImage* DecodedCache::insert(int64_t index, const CachedImage& image) {
  RN_CHECK(index >= 0 && index < size()) << "cache index " << index << " outside [0, " << size() << ")";
  auto& slot = slots_[static_cast<size_t>(index)];
  if (const CachedImage* existing = slot.load(std::memory_order_acquire)) return existing;
  const size_t bytes = image.bytes();
  // Reserve the bytes first so that concurrent inserts never overshoot the capacity.
  size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used + bytes > capacity_) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  auto* entry = new CachedImage(image);
  CachedImage* expected = nullptr;
  if (!slot.compare_exchange_strong(expected, entry, std::memory_order_acq_rel)) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);  // another thread cached it first
    delete entry;
    return expected;
  }
  entries_.fetch_add(1, std::memory_order_relaxed);
  return entry;
}

}  // namespace rn

// An in-memory cache of decoded, downscaled images (shorter side at most `short_side`
// pixels) that later epochs read instead of reading and decoding the file again. Entries are
// inserted until `capacity_bytes` is used, then the cache stops growing: with random access
// every image is equally likely next, so keeping the first ones is as good as any eviction
// and costs no locking. Lookups and inserts are lock-free and safe from any thread; an entry
// never changes once published, so a cache hit gives exactly the pixels the miss produced.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rn {

struct CachedImage {
  std::vector<uint8_t> pixels;  // height * width * 3, RGB HWC
  int width = 0;
  int height = 0;
  int label = -1;
  size_t bytes() const { return pixels.size() + sizeof(CachedImage); }
};

class DecodedCache {
 public:
  DecodedCache(int64_t num_images, size_t capacity_bytes, int short_side);
  ~DecodedCache();
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  // The entry for image `index`, or nullptr.
  const CachedImage* find(int64_t index) const;
  // Stores a copy of `image` for `index` if it fits (nothing is copied when it does not).
  // Returns the entry now cached for `index` (this one, or one another thread stored
  // first), or nullptr when the cache is full.
  const CachedImage* insert(int64_t index, const CachedImage& image);

  int short_side() const { return short_side_; }
  size_t capacity_bytes() const { return capacity_; }
  size_t bytes_used() const { return used_.load(std::memory_order_relaxed); }
  int64_t entries() const { return entries_.load(std::memory_order_relaxed); }
  int64_t size() const { return static_cast<int64_t>(slots_.size()); }
  // Inserts refused for want of room so far: the cache is full for the images it lacks.
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::vector<std::atomic<CachedImage*>> slots_;
  size_t capacity_;
  int short_side_;
  std::atomic<size_t> used_{0};
  std::atomic<int64_t> entries_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace rn

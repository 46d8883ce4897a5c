#include "model/memory_planner.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/tensor.h"

namespace rn {

std::string_view memory_level_name(MemoryLevel l) {
  switch (l) {
    case MemoryLevel::O0:
      return "O0";
    case MemoryLevel::O1:
      return "O1";
    case MemoryLevel::O2:
      return "O2";
  }
  return "?";
}

MemoryLevel memory_level_from_name(std::string_view name) {
  for (MemoryLevel l : {MemoryLevel::O0, MemoryLevel::O1, MemoryLevel::O2}) {
    const std::string_view n = memory_level_name(l);
    if (name == n || (name.size() == 2 && name[0] == 'o' && name[1] == n[1])) return l;
  }
  RN_FAIL() << "unknown memory level '" << name << "' (expected O0, O1 or O2)";
}

namespace {
struct Interval {
  int first, last;
};
Interval lifetime(const BufferSpec& b, int num_steps) {
  if (b.persistent) return {0, num_steps};
  return {b.first, std::max(b.first, b.last)};
}
bool intersects(Interval a, Interval b) { return a.first <= b.last && b.first <= a.last; }
}  // namespace

size_t plan_memory(std::vector<BufferSpec>& buffers, MemoryLevel level, int num_steps) {
  for (const auto& b : buffers)
    RN_CHECK(b.persistent || b.first >= 0) << "buffer '" << b.name << "' is never written by the program";
  if (level == MemoryLevel::O0) {
    size_t end = 0;
    for (auto& b : buffers) {
      b.offset = end;
      end = align_up(end + b.bytes, Arena::kAlignment);
    }
    return end;
  }
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  std::vector<size_t> placed;
  size_t arena = 0;
  std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) ranges of conflicting placed buffers
  for (size_t i : order) {
    BufferSpec& b = buffers[i];
    const Interval life = lifetime(b, num_steps);
    busy.clear();
    for (size_t j : placed) {
      const BufferSpec& o = buffers[j];
      if (intersects(life, lifetime(o, num_steps))) busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    size_t candidate = 0;
    for (const auto& [begin, end] : busy) {
      if (candidate + b.bytes <= begin) break;
      candidate = std::max(candidate, align_up(end, Arena::kAlignment));
    }
    b.offset = candidate;
    arena = std::max(arena, align_up(candidate + b.bytes, Arena::kAlignment));
    placed.push_back(i);
  }
  return arena;
}

void validate_plan(const std::vector<BufferSpec>& buffers, size_t arena_bytes, int num_steps) {
  for (const auto& b : buffers) {
    RN_CHECK(b.offset % Arena::kAlignment == 0) << "buffer '" << b.name << "' is misaligned at " << b.offset;
    RN_CHECK(b.offset + b.bytes <= arena_bytes)
        << "buffer '" << b.name << "' [" << b.offset << ", " << b.offset + b.bytes << ") overruns the arena of "
        << arena_bytes << " bytes";
  }
  // Sweep by offset so that only neighbours in address space are compared.
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].offset < buffers[b].offset; });
  for (size_t x = 0; x < order.size(); ++x) {
    const BufferSpec& a = buffers[order[x]];
    if (a.bytes == 0) continue;
    for (size_t y = x + 1; y < order.size(); ++y) {
      const BufferSpec& b = buffers[order[y]];
      if (b.offset >= a.offset + a.bytes) break;
      if (b.bytes == 0) continue;
      RN_CHECK(!intersects(lifetime(a, num_steps), lifetime(b, num_steps)))
          << "memory plan conflict: '" << a.name << "' [" << a.offset << ", " << a.offset + a.bytes << ") live steps "
          << a.first << ".." << a.last << " overlaps '" << b.name << "' [" << b.offset << ", " << b.offset + b.bytes
          << ") live steps " << b.first << ".." << b.last;
    }
  }
}

}  // namespace rn

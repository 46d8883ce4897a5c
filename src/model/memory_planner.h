// The memory planner: gives every buffer of a step program an offset in one arena.
//   O0: no reuse; every buffer has its own range (simplest, for debugging).
//   O1: reuse by liveness; buffers whose lifetimes (first write .. last read, in program
//       steps, inclusive) do not intersect may share memory. Greedy: largest first, each at
//       the lowest offset that conflicts with no placed, simultaneously live buffer.
//   O2: O1's placement of a program that keeps less alive: the plan (plan.h) frees BN and
//       ReLU outputs after forward and recomputes them just before backward reads them.
// validate_plan() checks that no two simultaneously live buffers overlap and every
// buffer lies inside the arena; it runs on every plan in debug builds and in tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rn {

enum class MemoryLevel : uint8_t { O0, O1, O2 };
std::string_view memory_level_name(MemoryLevel l);
// "O0", "O1", "O2" (or lower case); anything else is an error listing the levels.
MemoryLevel memory_level_from_name(std::string_view name);

struct BufferSpec {
  std::string name;
  size_t bytes = 0;
  int first = -1;  // first step that writes it
  int last = -1;   // last step that reads it
  bool persistent = false;  // live for the whole program (inputs, labels, outputs read by the caller)
  size_t offset = 0;        // filled in by plan_memory
};

// Assigns offsets (aligned to 64 bytes) and returns the arena size in bytes.
size_t plan_memory(std::vector<BufferSpec>& buffers, MemoryLevel level, int num_steps);
// Throws rn::Error naming the two buffers that overlap while both live.
void validate_plan(const std::vector<BufferSpec>& buffers, size_t arena_bytes, int num_steps);

}  // namespace rn

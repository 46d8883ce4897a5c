// Measured memory, to hold against the planned figures (plan.h, MemoryReport):
//   process_memory()  resident set size now and its peak (VmRSS, VmHWM of /proc/self/status);
//   reset_peak_resident()  starts the peak afresh (writes 5 to /proc/self/clear_refs);
//   resident_range()  which pages of a range the program has touched (mincore): a plan
//                     releases its arena's pages once at creation, so afterwards the touched
//                     pages are exactly what the program wrote, and the last touched byte is
//                     the arena's high-water mark.
// On a system without /proc or mincore the figures are 0 and reset_peak_resident() false.
#pragma once

#include <cstddef>

namespace rn {

struct ProcessMemory {
  size_t resident = 0;       // bytes
  size_t peak_resident = 0;  // bytes, since process start or the last reset_peak_resident()
};
ProcessMemory process_memory();
bool reset_peak_resident();
// Memory the system can still give without swapping (MemAvailable of /proc/meminfo), or 0
// when unknown.
size_t available_memory();

struct RangeResidency {
  size_t touched = 0;     // bytes of the range on resident pages
  size_t high_water = 0;  // offset just past the last resident page (clamped to the range)
};
RangeResidency resident_range(const void* data, size_t bytes);
// Gives the whole pages inside [data, data + bytes) back to the system; they read as zero
// when next touched. Only for memory whose contents do not matter.
void release_pages(void* data, size_t bytes);

}  // namespace rn

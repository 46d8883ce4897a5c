#include "model/memory_usage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace rn {

namespace {
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kib) == 1) m.resident = static_cast<size_t>(kib) * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %llu kB", &kib) == 1) m.peak_resident = static_cast<size_t>(kib) * 1024;
  }
  return m;
}

size_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return static_cast<size_t>(kib) * 1024;
  }
  return 0;
}

bool reset_peak_resident() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

RangeResidency resident_range(const void* data, size_t bytes) {
  RangeResidency r;
  if (data == nullptr || bytes == 0) return r;
  const size_t ps = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = begin / ps * ps;
  const size_t pages = (begin + bytes - first + ps - 1) / ps;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(first), pages * ps, vec.data()) != 0) return r;
  for (size_t i = 0; i < pages; ++i) {
    if (!(vec[i] & 1)) continue;
    const uintptr_t lo = std::max<uintptr_t>(first + i * ps, begin);
    const uintptr_t hi = std::min<uintptr_t>(first + (i + 1) * ps, begin + bytes);
    r.touched += hi - lo;
    r.high_water = hi - begin;
  }
  return r;
}

void release_pages(void* data, size_t bytes) {
  const size_t ps = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lo = (begin + ps - 1) / ps * ps, hi = (begin + bytes) / ps * ps;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace rn

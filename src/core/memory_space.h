// Where tensors live. A MemorySpace allocates, frees, copies and zeroes bytes in one kind
// of memory; the host space is aligned host memory (large blocks in huge pages), a device
// backend brings its own (CUDA: device memory, copies through the runtime, which with
// unified addressing works in every direction). Plans, arenas and the model's flat buffers
// allocate through the backend's space, so a CPU run is unchanged and a GPU run keeps
// everything on the device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace rn {

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual Device device() const = 0;
  // At least Arena::kAlignment-aligned; throws rn::Error when out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  // dst and src may each be host memory or this space's memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Host or this space -> this space, ordered with the backend's queued work and not
  // waited for. The source may be reused when the call returns if it is pageable host
  // memory (the driver stages it); pinned sources and device sources must stay unchanged
  // until the work has run.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes) { copy(dst, src, bytes); }
  virtual void zero(void* p, size_t bytes) = 0;
  // The most bytes allocated at once so far (0 where not tracked: host memory), or since
  // reset_peak(), which starts it afresh at what is allocated now.
  virtual size_t peak_bytes() const { return 0; }
  virtual void reset_peak() {}
};

MemorySpace& host_memory();

// Host memory as the host space and HostBuffer allocate it, released with std::free. At
// least Arena::kAlignment-aligned; a block of host_huge_page_bytes() or more is aligned to
// it, rounded up to whole huge pages and advised MADV_HUGEPAGE. Throws rn::Error when out
// of memory.
void* host_allocate(size_t bytes);
// The transparent huge page size the host allocator uses (2 MiB on x86-64), or 0: no THP
// in this kernel, or RN_HUGE_PAGES=0 in the environment (read once, at the first call).
size_t host_huge_page_bytes();
// One line for a run's log: the page size host blocks get and why ("blocks of 2 MiB and more
// in transparent huge pages (THP madvise, defrag madvise; ...)", "4 KiB pages (RN_HUGE_PAGES=0)").
std::string host_memory_description();

namespace detail {
struct SpaceFree {
  MemorySpace* space = nullptr;
  void operator()(void* p) const noexcept {
    if (space) space->free(p);
  }
};
}  // namespace detail

// Owning block in a MemorySpace.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(MemorySpace& space, size_t bytes);
  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  MemorySpace* space() const { return space_; }
  Device device() const { return space_ ? space_->device() : Device::cpu; }
  void zero();

 private:
  std::unique_ptr<void, detail::SpaceFree> data_;
  MemorySpace* space_ = nullptr;
  size_t bytes_ = 0;
};

// Host -> device staging for the input pipeline, double-buffered: the next batch crosses
// into one buffer on a queue of its own (CUDA: a second stream, from pinned host memory)
// while the device still computes with the batch staged in the other.
//   char* dst = static_cast<char*>(up.begin());  // the next buffer, once what read it has run
//   up.copy(dst + offset, src, bytes);           // any number of copies into it
//   up.end();        // compute queued from now on waits for the copies (the host does not);
//                    // returns once the sources have been read and may be reused
//   ... queue compute that reads dst ...
//   up.release();    // dst may be overwritten once the compute queued so far has run
class Uploader {
 public:
  virtual ~Uploader() = default;
  virtual void* begin() = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void end() = 0;
  virtual void release() = 0;
};

// One buffer of `bytes` in `space`, filled by space.copy() (synchronous): what host
// backends and test doubles use.
std::unique_ptr<Uploader> make_plain_uploader(MemorySpace& space, size_t bytes);

}  // namespace rn

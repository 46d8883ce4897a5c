// Where tensors live. A MemorySpace allocates, frees, copies and zeroes bytes in one kind
// of memory; the host space is plain aligned host memory, a device backend brings its own
// (CUDA: device memory, copies through the runtime, which with unified addressing works in
// every direction). Plans, arenas and the model's flat buffers allocate through the
// backend's space, so a CPU run is unchanged and a GPU run keeps everything on the device.
#pragma once

#include <cstddef>
#include <memory>

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
  // Host -> this space, ordered with the backend's queued work and not waited for. The
  // source may be reused when the call returns if it is pageable host memory (the driver
  // stages it); pinned sources must stay unchanged until the work has run.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes) { copy(dst, src, bytes); }
  virtual void zero(void* p, size_t bytes) = 0;
  // The most bytes allocated at once so far (0 where not tracked: host memory).
  virtual size_t peak_bytes() const { return 0; }
};

MemorySpace& host_memory();

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

}  // namespace rn

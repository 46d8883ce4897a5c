#include "core/memory_space.h"

#include <cstdlib>
#include <cstring>

namespace rn {

namespace {
class HostMemory final : public MemorySpace {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(Arena::kAlignment, align_up(bytes == 0 ? 1 : bytes, Arena::kAlignment));
    RN_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
    return p;
  }
  void free(void* p) noexcept override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
};
}  // namespace

MemorySpace& host_memory() {
  static HostMemory host;
  return host;
}

DeviceBuffer::DeviceBuffer(MemorySpace& space, size_t bytes) : space_(&space), bytes_(bytes) {
  data_ = std::unique_ptr<void, detail::SpaceFree>(space.allocate(bytes), detail::SpaceFree{&space});
}

void DeviceBuffer::zero() {
  if (space_ && data_) space_->zero(data_.get(), bytes_);
}

}  // namespace rn

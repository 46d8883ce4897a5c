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

namespace {
class PlainUploader final : public Uploader {
 public:
  PlainUploader(MemorySpace& space, size_t bytes) : space_(space), buffer_(space, bytes) {}
  void* begin() override {
    RN_CHECK(!open_) << "Uploader: begin() twice without end()";
    open_ = true;
    return buffer_.data();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    const auto* d = static_cast<const char*>(dst);
    const auto* b = static_cast<const char*>(buffer_.data());
    RN_CHECK(open_ && d >= b && d + bytes <= b + buffer_.bytes())
        << "Uploader: a copy of " << bytes << " bytes outside the open buffer of " << buffer_.bytes() << " bytes";
    space_.copy(dst, src, bytes);
  }
  void end() override { open_ = false; }
  void release() override {}

 private:
  MemorySpace& space_;
  DeviceBuffer buffer_;
  bool open_ = false;
};
}  // namespace

std::unique_ptr<Uploader> make_plain_uploader(MemorySpace& space, size_t bytes) {
  return std::make_unique<PlainUploader>(space, bytes);
}

void DeviceBuffer::zero() {
  if (space_ && data_) space_->zero(data_.get(), bytes_);
}

}  // namespace rn

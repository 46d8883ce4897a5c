#include "core/memory_space.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace rn {

namespace {
// The size of a transparent huge page, 0 where the kernel has none or RN_HUGE_PAGES=0.
size_t read_huge_page_bytes() {
  if (const char* env = std::getenv("RN_HUGE_PAGES"); env && *env) {
    const std::string v(env);
    RN_CHECK(v == "0" || v == "1") << "RN_HUGE_PAGES=" << v
                                   << ": expected 0 (4 KiB pages only) or 1 (huge pages for large host blocks)";
    if (v == "0") return 0;
  }
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  size_t bytes = 0;
  if (!(f >> bytes) || bytes < 4096 || (bytes & (bytes - 1)) != 0) return 0;
  return bytes;
}
}  // namespace

size_t host_huge_page_bytes() {
  static const size_t bytes = read_huge_page_bytes();
  return bytes;
}

void* host_allocate(size_t bytes) {
  const size_t huge = host_huge_page_bytes();
  void* p = nullptr;
  if (huge != 0 && bytes >= huge) {
    // Whole huge pages, marked for the kernel: a step's arena and the model's flat buffers
    // (hundreds of MB for ResNet-50) then cost one fault and one TLB entry per 2 MiB instead
    // of per 4 KiB. Hosts whose THP mode is "madvise" (the common default) give huge pages
    // only to ranges marked so; at "always" the mark changes nothing, at "never" it is ignored.
    const size_t size = align_up(bytes, huge);
    p = std::aligned_alloc(huge, size);
    if (p != nullptr) madvise(p, size, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
  } else {
    p = std::aligned_alloc(Arena::kAlignment, align_up(bytes == 0 ? 1 : bytes, Arena::kAlignment));
  }
  RN_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  return p;
}

namespace {
class HostMemory final : public MemorySpace {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override { return host_allocate(bytes); }
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

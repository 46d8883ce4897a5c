#include "core/memory_space.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace rn {

namespace {
struct HugePages {
  size_t bytes = 0;     // the transparent huge page size in use; 0: none
  std::string why_off;  // where bytes is 0
};

// The first word in brackets of a /sys/kernel/mm/transparent_hugepage setting ("always
// [madvise] never" -> "madvise"), or "" where the file is missing.
std::string thp_setting(const char* name) {
  std::ifstream f(std::string("/sys/kernel/mm/transparent_hugepage/") + name);
  std::string line;
  if (!std::getline(f, line)) return "";
  const size_t open = line.find('['), close = line.find(']', open);
  return open == std::string::npos || close == std::string::npos ? "" : line.substr(open + 1, close - open - 1);
}

HugePages read_huge_pages() {
  if (const char* env = std::getenv("RN_HUGE_PAGES"); env && *env) {
    const std::string v(env);
    RN_CHECK(v == "0" || v == "1") << "RN_HUGE_PAGES=" << v
                                   << ": expected 0 (4 KiB pages only) or 1 (huge pages for large host blocks)";
    if (v == "0") return {0, "RN_HUGE_PAGES=0"};
  }
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  size_t bytes = 0;
  if (!(f >> bytes) || bytes < 4096 || (bytes & (bytes - 1)) != 0)
    return {0, "this kernel has no transparent huge pages"};
  return {bytes, ""};
}

const HugePages& huge_pages() {
  static const HugePages h = read_huge_pages();
  return h;
}
}  // namespace

size_t host_huge_page_bytes() { return huge_pages().bytes; }

std::string host_memory_description() {
  const HugePages& h = huge_pages();
  if (h.bytes == 0) return "4 KiB pages (" + h.why_off + ")";
  const std::string size =
      h.bytes % (1u << 20) == 0 ? std::to_string(h.bytes >> 20) + " MiB" : std::to_string(h.bytes >> 10) + " KiB";
  const std::string enabled = thp_setting("enabled"), defrag = thp_setting("defrag");
  if (enabled == "never")
    return "4 KiB pages: blocks of " + size + " and more ask for huge pages, but the system's THP mode is never";
  return "blocks of " + size + " and more in transparent huge pages (THP " + (enabled.empty() ? "?" : enabled) +
         ", defrag " + (defrag.empty() ? "?" : defrag) + "; RN_HUGE_PAGES=0 for 4 KiB pages)";
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

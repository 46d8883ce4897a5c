// libFuzzer target for the weights and checkpoint reader (src/model/safetensors.cpp): any
// file must load or be refused with rn::Error, never crash, hang or read out of bounds. The
// bytes go through a memfd, since the reader takes a path; every tensor of a file that loads
// is then read through view() and raw().
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "core/check.h"
#include "model/safetensors.h"

static volatile uint64_t sink;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  std::optional<rn::SafetensorsFile> file;
  try {
    file.emplace(rn::SafetensorsFile::load(path));
  } catch (const rn::Error&) {
    return 0;
  }
  // A file that loads reads whole: raw() or view() throwing, or a size that disagrees with the
  // header, is a finding (an exception here ends the fuzzer).
  uint64_t sum = 0;
  for (const rn::SafetensorsEntry& e : file->entries()) {
    const std::span<const std::byte> bytes = file->raw(e.name);
    if (bytes.size() != e.bytes()) std::abort();
    for (const std::byte b : bytes) sum += static_cast<uint8_t>(b);
    if (e.dtype && file->view(e.name).bytes() != e.bytes()) std::abort();
  }
  sink = sum;  // keeps the reads
  return 0;
}

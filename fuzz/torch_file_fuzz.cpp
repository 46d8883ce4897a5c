// libFuzzer target for the PyTorch file reader (src/model/torch_file.cpp, `resnet import` and
// model.pretrained): any bytes must parse or be refused with rn::Error, never crash, hang, read
// out of bounds or allocate more than the input could hold. The seeds are small torch.save
// files in both containers (fuzz/seeds-torch_file_fuzz/); every tensor of a file that parses
// is read whole.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/check.h"
#include "model/torch_file.h"

static volatile uint64_t sink;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const rn::TorchStateDict sd = rn::parse_torch_state_dict(bytes, "fuzz.pth");
    uint64_t sum = 0;
    for (const auto& [name, t] : sd.tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      // The bytes must be the shape's worth of elements.
      if (t.data.size() != static_cast<size_t>(n) * t.element_size) std::abort();
      for (const std::byte b : t.data) sum += static_cast<uint8_t>(b);
      sum += name.size();
    }
    sink = sum;
  } catch (const rn::Error&) {
  }
  return 0;
}

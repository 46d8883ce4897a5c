#include "data/synthetic_dataset.h"

#include <cstring>

#include "core/check.h"
#include "core/rng.h"

namespace rn {

SyntheticDataset::SyntheticDataset(const SyntheticOptions& options) : options_(options) {
  RN_CHECK(options.channels >= 1 && options.height >= 1 && options.width >= 1)
      << "synthetic image shape " << options.channels << "x" << options.height << "x" << options.width;
  RN_CHECK(options.num_classes >= 1) << "synthetic num_classes " << options.num_classes;
  RN_CHECK(options.size >= 0) << "synthetic size " << options.size;
}

std::string SyntheticDataset::name() const {
  return "synthetic:" + geometry().str() + "x" + std::to_string(options_.num_classes) + "classes";
}

void SyntheticDataset::load(int64_t index, Sample& out) const {
  RN_CHECK(index >= 0 && index < options_.size) << "index " << index << " outside " << name();
  Rng rng = Rng(options_.seed).fork(static_cast<uint64_t>(index));
  const int label = static_cast<int>(rng.below(static_cast<uint64_t>(options_.num_classes)));
  const int C = options_.channels;
  uint8_t* px = out.resize(C, options_.height, options_.width);
  const size_t n = out.pixels.size();

  // Noise in [0, 128) from 8 bytes per draw, then a class- and channel-dependent offset in [0, 128).
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.next_u64() & 0x7f7f7f7f7f7f7f7full;
    std::memcpy(px + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = rng.next_u64() & 0x7f7f7f7f7f7f7f7full;
    std::memcpy(px + i, &r, n - i);
  }
  uint8_t level[64];
  for (int c = 0; c < 64; ++c) level[c] = static_cast<uint8_t>((label * 37 + c * 59) & 0x7f);
  if (C == 1) {
    for (size_t k = 0; k < n; ++k) px[k] = static_cast<uint8_t>(px[k] + level[0]);
  } else {
    for (size_t k = 0; k < n; k += static_cast<size_t>(C)) {
      for (int c = 0; c < C; ++c)
        px[k + static_cast<size_t>(c)] = static_cast<uint8_t>(px[k + static_cast<size_t>(c)] + level[c & 63]);
    }
  }
  out.label = label;
}

}  // namespace rn

// libFuzzer target: arbitrary bytes through the image decoders and the crop/resize path the
// loader runs. Bad input must end in rn::Error, never a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "data/augment.h"
#include "data/image_codec.h"
#include "data/image_resize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rn;
  EncodedImage image;
  image.bytes = std::span<const uint8_t>(data, size);
  try {
    const ImageInfo info = image_info(image);
    // Keep the fuzzer fast: huge declared sizes are legal but slow to decode.
    if (int64_t{info.width} * info.height > (1 << 22)) return 0;
    AugmentScratch scratch;
    Rng rng(size);
    RandomResizedCropOptions o;
    o.height = o.width = 32;
    RandomResizedCrop crop(o);
    const CropPlan plan = crop.plan(info.width, info.height, rng);
    decode_image(image, plan.request, scratch.decoded);
    std::vector<uint8_t> out(32 * 32 * 3);
    render(scratch.decoded, plan, out.data(), 0, scratch.resize);
    decode_image(image, DecodeRequest{}, scratch.decoded);
  } catch (const Error&) {
  }
  return 0;
}

#include "train/versions.h"

#include "data/image_codec.h"
#include "dist/communicator.h"
#include "ops/backend.h"

namespace rn {

std::vector<LibraryVersion> library_versions() {
  std::vector<LibraryVersion> out = backend_library_versions();
  for (auto* more : {&communication_library_versions, &image_codec_versions})
    for (LibraryVersion& l : more()) out.push_back(std::move(l));
  return out;
}

std::string software_description() { return build_description() + "; " + describe_libraries(library_versions()); }

}  // namespace rn

#include "core/build_info.h"

#include <fmt/format.h>

namespace rn {

std::string build_description() {
  const BuildInfo& b = build_info();
  return fmt::format("resnet.cpp {} (commit {}{}, {}, {}{})", b.version, b.commit, b.modified ? "+modified" : "",
                     b.build_type.empty() ? "no build type" : b.build_type, b.compiler,
                     b.sanitizers ? ", sanitizers" : "");
}

std::string describe_libraries(const std::vector<LibraryVersion>& libraries) {
  std::string s;
  for (const LibraryVersion& l : libraries) {
    if (!s.empty()) s += ", ";
    s += l.name + " " + l.version;
  }
  return s;
}

}  // namespace rn

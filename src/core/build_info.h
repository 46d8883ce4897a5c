// Which build of resnet.cpp is running: its version, the git commit of the source it was built
// from, the build type and the compiler. Every run records it (train.log, checkpoints,
// weights files, `resnet bench --json`), so that a figure or a file can be traced to the code
// that made it; `resnet --version` prints it with the versions of the libraries in use.
//
// The values come from a file generated at build time (cmake/build_info.cmake), refreshed by
// every build, so a commit or an edit since the last build shows up in the next one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rn {

struct BuildInfo {
  std::string_view version;     // the project's version, "0.1.0"
  std::string_view commit;      // 12 hex digits of the source's git commit, "unknown" outside a git tree
  bool modified = false;        // tracked files differed from that commit when it was built
  std::string_view build_type;  // CMAKE_BUILD_TYPE: "Release", "Debug", ...
  std::string_view compiler;    // "GNU 12.2.0"
  bool sanitizers = false;      // built with AddressSanitizer and UndefinedBehaviorSanitizer
};

const BuildInfo& build_info();

// One line: "resnet.cpp 0.1.0 (commit 012ad84abcde, Release, GNU 12.2.0)"; "commit X+modified"
// when the tree had uncommitted changes, ", sanitizers" in a sanitizer build.
std::string build_description();

// A library that a build uses, with the version it runs with (the one loaded at run time
// where the library can say, else the one compiled against).
struct LibraryVersion {
  std::string name;     // "oneDNN", "cuDNN", ...
  std::string version;  // "2.7.3", or why there is none ("no driver")
};

// "oneDNN 2.7.3, Open MPI 4.1.4, ..."
std::string describe_libraries(const std::vector<LibraryVersion>& libraries);

}  // namespace rn

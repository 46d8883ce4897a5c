// The Python that tests run for golden data and file fixtures: Debian's /usr/bin/python3, with
// python3-torch and python3-torchvision, unless RN_PYTHON names another.
#pragma once

#include <cstdlib>
#include <string>

namespace rn::test {

inline std::string python() {
  const char* v = std::getenv("RN_PYTHON");
  return v && *v ? v : "/usr/bin/python3";
}

}  // namespace rn::test

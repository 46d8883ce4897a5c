// A count with its noun in the right number: counted(1, "epoch") is "1 epoch",
// counted(3, "epoch") is "3 epochs", counted(2, "class", "classes") is "2 classes".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rn {

inline std::string counted(int64_t n, std::string_view one, std::string_view many = {}) {
  std::string s = std::to_string(n) + " ";
  if (n == 1) return s.append(one);
  if (many.empty()) return s.append(one).append("s");
  return s.append(many);
}

}  // namespace rn

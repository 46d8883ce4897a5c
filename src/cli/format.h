// Small formatting helpers for the command's tables.
#pragma once

#include <cstdint>
#include <string>

namespace rn::cli {

std::string with_commas(int64_t v);  // 25557032 -> "25,557,032"
std::string human_bytes(double bytes);  // "97.6 MiB"

}  // namespace rn::cli

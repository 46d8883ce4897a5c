// Small formatting helpers for the command's tables.
#pragma once

#include <cstdint>
#include <string>

namespace rn::cli {

std::string with_commas(int64_t v);  // 25557032 -> "25,557,032"
std::string human_bytes(double bytes);  // "97.6 MiB"
// Parses "CxHxW" (e.g. 3x224x224); throws rn::Error naming the text otherwise.
void parse_input_shape(const std::string& text, int64_t* c, int64_t* h, int64_t* w);

}  // namespace rn::cli

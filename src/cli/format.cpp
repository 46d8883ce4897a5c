#include "cli/format.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/check.h"

namespace rn::cli {

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

void check_output_path(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (is_special_file(path)) return;               // a device or a pipe: written in place
  const std::string target = output_target(path);  // a symbolic link: where it points
  RN_CHECK(!fs::is_directory(target, ec)) << option << " '" << path << "' is a folder; give a file name";
  const fs::path parent = fs::path(target).parent_path().empty() ? fs::path(".") : fs::path(target).parent_path();
  RN_CHECK(fs::is_directory(parent, ec)) << option << " '" << path << "': the folder '" << parent.string()
                                         << "' does not exist";
  RN_CHECK(::access(parent.c_str(), W_OK) == 0)
      << option << " '" << path << "': the folder '" << parent.string() << "' is not writable";
}

DType compute_dtype_from_name(const std::string& text, const std::string& option, bool half_only) {
  std::optional<DType> dt;
  try {
    dt = dtype_from_name(text);
  } catch (const Error&) {
  }
  RN_CHECK(dt && (*dt == DType::bf16 || *dt == DType::f16 || (*dt == DType::f32 && !half_only)))
      << option << " must be " << (half_only ? "bf16 or fp16" : "fp32, bf16 or fp16") << ", got '" << text << "'";
  return *dt;
}

Bf16ConvArithmetic bf16_conv_arithmetic_from_name(const std::string& text) {
  return parse_enum(text, {Bf16ConvArithmetic::automatic, Bf16ConvArithmetic::native, Bf16ConvArithmetic::fp32},
                    "--bf16-conv-arithmetic");
}

DType compute_dtype_for(const std::string& text, const std::string& precision) {
  if (!text.empty()) return compute_dtype_from_name(text, "--dtype");
  return precision.empty() || precision == "O0" ? DType::f32 : DType::bf16;
}

size_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double scale = 0;
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"K", 1024.0},
                                                  {"KiB", 1024.0},
                                                  {"KB", 1024.0},
                                                  {"M", 1048576.0},
                                                  {"MiB", 1048576.0},
                                                  {"MB", 1048576.0},
                                                  {"G", 1073741824.0},
                                                  {"GiB", 1073741824.0},
                                                  {"GB", 1073741824.0},
                                                  {"T", 1099511627776.0},
                                                  {"TiB", 1099511627776.0},
                                                  {"TB", 1099511627776.0}};
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  RN_CHECK(used > 0 && scale > 0 && std::isfinite(v) && v > 0)
      << what << ": '" << text << "' is not a positive byte count (examples: 1073741824, 8G, 1.5GiB, 512MiB)";
  // "1.5" without a unit is a byte and a half, surely meant as 1.5 GiB or so.
  RN_CHECK(scale > 1 || v == std::floor(v))
      << what << ": '" << text << "' is a fraction of a byte; give a unit (examples: 1.5GiB, 512MiB)";
  RN_CHECK(v * scale < kMaxByteCount) << what << ": '" << text
                                      << "' is more bytes than any memory or file holds (at most "
                                      << "8 EiB)";
  return static_cast<size_t>(v * scale);
}

void parse_input_shape(const std::string& s, int64_t* c, int64_t* h, int64_t* w) {
  long cc = 0, hh = 0, ww = 0;
  char x1 = 0, x2 = 0, extra = 0;
  RN_CHECK(std::sscanf(s.c_str(), "%ld%c%ld%c%ld%c", &cc, &x1, &hh, &x2, &ww, &extra) == 5 && x1 == 'x' &&
           x2 == 'x' && cc > 0 && hh > 0 && ww > 0)
      << "input shape '" << s << "' must look like CxHxW with positive sizes, for example 3x224x224";
  *c = cc;
  *h = hh;
  *w = ww;
}

ModelOptions model_options_for(const std::string& model, const std::string& input, int64_t classes) {
  ModelOptions o = default_model_options(model);
  if (!input.empty()) parse_input_shape(input, &o.in_channels, &o.height, &o.width);
  if (classes != 0) o.num_classes = classes;
  return o;
}

PrecisionLevel precision_level_for(const std::string& precision, DType dtype) {
  if (precision.empty()) return dtype == DType::f32 ? PrecisionLevel::O0 : PrecisionLevel::O2;
  const PrecisionLevel level = parse_enum(
      precision, {PrecisionLevel::O0, PrecisionLevel::O1, PrecisionLevel::O2, PrecisionLevel::O3}, "precision level");
  RN_CHECK(level != PrecisionLevel::O0 || dtype == DType::f32)
      << "--dtype " << dtype_name(dtype) << " with --precision O0: O0 is fp32 everywhere; use --precision O1, O2 or O3";
  RN_CHECK(level == PrecisionLevel::O0 || dtype != DType::f32)
      << "--precision " << enum_name(level) << " with --dtype fp32: name the half dtype (--dtype bf16 or fp16)";
  return level;
}

namespace {
CLI::Validator number_above(double lo, bool strict, const char* name) {
  return CLI::Validator(
      [lo, strict](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return fmt::format("expected a number, got '{}'", text);
        if (strict ? v > lo : v >= lo) return {};
        return fmt::format("must be {} {}, got {}", strict ? ">" : ">=", lo, text);
      },
      name);
}
}  // namespace

CLI::Validator positive_number() { return number_above(0, true, "POSITIVE"); }
CLI::Validator non_negative_number() { return number_above(0, false, "NON-NEGATIVE"); }

}  // namespace rn::cli

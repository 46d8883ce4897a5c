// Small formatting helpers for the command's tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "model/zoo.h"
#include "train/config.h"

namespace rn::cli {

std::string with_commas(int64_t v);  // 25557032 -> "25,557,032"
std::string human_bytes(double bytes);  // "97.6 MiB"
// Parses a byte count: a number with an optional binary unit, K/M/G/T, KiB/MiB/GiB/TiB or
// KB/MB/GB/TB (all powers of 1024), e.g. "1073741824", "8G", "1.5GiB", "512MiB". Throws
// rn::Error naming `what` and the text otherwise.
size_t parse_bytes(const std::string& text, const std::string& what);
// The largest byte count a size option takes (8 EiB, below 2^63): past it the conversion to an
// integer is undefined (x86 gives 0), and no memory or file is that large.
inline constexpr double kMaxByteCount = 9.2e18;
// Parses "CxHxW" (e.g. 3x224x224); throws rn::Error naming the text otherwise.
void parse_input_shape(const std::string& text, int64_t* c, int64_t* h, int64_t* w);
// The model options of a command's --model, --input and --classes: those given, or where one is
// not ("" / 0) the model's own (default_model_options: 3x224x224 and 1000 classes for the
// ImageNet models, 3x32x32 and 10 for the CIFAR ones).
ModelOptions model_options_for(const std::string& model, const std::string& input, int64_t classes);
inline constexpr const char* kInputHelp =
    "Input shape CxHxW (default: the model's own, 3x224x224; 3x32x32 for resnet20..110)";
inline constexpr const char* kClassesHelp = "Number of classes (default: the model's own, 1000; 10 for resnet20..110)";
// The compute dtype an option names: fp32, bf16 or fp16 (with `half_only`, bf16 or fp16); throws
// rn::Error naming `option` and the text for any other (int32 and uint8 are storage types).
DType compute_dtype_from_name(const std::string& text, const std::string& option, bool half_only = false);
// The dtype of `--dtype` (`text`), or, when it was not given (empty), the one `--precision`
// implies: fp32 for none or O0, bf16 for O1-O3 (as bench's --half).
DType compute_dtype_for(const std::string& text, const std::string& precision);
// The precision level that `--precision` names, or, when it is empty, the one `--dtype`
// implies (O0 for fp32, O2 for a half dtype); throws rn::Error for an unknown level, a half
// dtype at O0 or fp32 at O1-O3.
PrecisionLevel precision_level_for(const std::string& precision, DType dtype);
// --bf16-conv-arithmetic's value (auto, native or fp32: run.cpu_bf16_conv_arithmetic); throws
// rn::Error naming the option and the text otherwise.
Bf16ConvArithmetic bf16_conv_arithmetic_from_name(const std::string& text);
inline constexpr const char* kBf16ConvArithmeticHelp =
    "run.cpu_bf16_conv_arithmetic: the cpu backend's bf16 convolutions in oneDNN's bf16 kernels (native), its fp32 "
    "ones on the same values (fp32), or as a timing of bf16 against fp32 at the first one decides (auto)";
// Throws rn::Error naming `option` unless `path` could be written later: its folder exists
// and is writable, and it is not itself a folder. Called before long work whose result goes
// there, so that a typo fails at once rather than after the work.
void check_output_path(const std::string& path, const std::string& option);
// The one of `values` whose enum_name() is `text`; throws rn::Error naming `what`, the text
// and the expected names otherwise.
template <typename E>
E parse_enum(const std::string& text, std::initializer_list<E> values, const char* what) {
  std::string expected;
  for (E v : values) {
    if (enum_name(v) == text) return v;
    expected += (expected.empty() ? "" : ", ") + std::string(enum_name(v));
  }
  RN_FAIL() << "unknown " << what << " '" << text << "' (expected " << expected << ")";
}

}  // namespace rn::cli

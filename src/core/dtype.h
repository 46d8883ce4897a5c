// Element types and conversions. bf16 and fp16 are stored as raw 16-bit patterns; the
// conversions round to nearest even, as hardware does, so host code and tests see the
// same values a device would produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace rn {

enum class DType : uint8_t { f32, bf16, f16, i32, u8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // "fp32"/"f32"/"float32", "bf16", ...

struct bf16_t {
  uint16_t bits = 0;
};
struct f16_t {
  uint16_t bits = 0;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  }
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>((u + rounding) >> 16)};
}
inline float bf16_to_f32(bf16_t h) { return f32_from_bits(static_cast<uint32_t>(h.bits) << 16); }

f16_t f32_to_f16(float f);
float f16_to_f32(f16_t h);

// Rounds a float to the nearest value representable in `t` (identity for f32).
float round_to_dtype(float f, DType t);

// Converts `n` elements between any two floating types (f32, bf16, f16).
void convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

// The arithmetic of the cpu backend's ungrouped bf16 convolutions (backends/cpu/conv2d.cpp,
// run.cpu_bf16_conv_arithmetic). native: oneDNN's bf16 kernels. fp32: the same bf16 values
// widened (exactly) to fp32 for oneDNN's fp32 kernels, the result rounded back to bf16.
// automatic: chosen per convolution from how fast this CPU's bf16 GEMM runs against its
// fp32 one (CpuBackendOptions::bf16_speedup).
enum class Bf16ConvArithmetic : uint8_t { automatic, native, fp32 };

}  // namespace rn

#include "core/dtype.h"

#include "core/check.h"

namespace rn {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  RN_FAIL() << "unknown dtype " << static_cast<int>(t);
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
  }
  return "unknown";
}

DType dtype_from_name(std::string_view n) {
  if (n == "fp32" || n == "f32" || n == "float32" || n == "float") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "fp16" || n == "f16" || n == "float16" || n == "half") return DType::f16;
  if (n == "int32" || n == "i32") return DType::i32;
  if (n == "uint8" || n == "u8") return DType::u8;
  RN_FAIL() << "unknown dtype '" << n << "' (expected one of fp32, bf16, fp16, int32, uint8)";
}

// IEEE binary16 conversion with round-to-nearest-even, subnormals, inf and NaN.
f16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) {  // inf or NaN
    return f16_t{static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u))};
  }
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return f16_t{static_cast<uint16_t>(sign)};  // underflow -> signed zero
    mant |= 0x800000u;                                       // implicit leading one
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return f16_t{static_cast<uint16_t>(sign | half_mant)};
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return f16_t{static_cast<uint16_t>(half)};
}

float f16_to_f32(f16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h.bits) & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

float round_to_dtype(float f, DType t) {
  switch (t) {
    case DType::f32: return f;
    case DType::bf16: return bf16_to_f32(f32_to_bf16(f));
    case DType::f16: return f16_to_f32(f32_to_f16(f));
    default: RN_FAIL() << "round_to_dtype: " << dtype_name(t) << " is not a floating type";
  }
}

namespace {
float load_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const f16_t*>(p)[i]);
    default: RN_FAIL() << "convert: " << dtype_name(t) << " is not a floating type";
  }
}
void store_float(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; return;
    case DType::bf16: static_cast<bf16_t*>(p)[i] = f32_to_bf16(v); return;
    case DType::f16: static_cast<f16_t*>(p)[i] = f32_to_f16(v); return;
    default: RN_FAIL() << "convert: " << dtype_name(t) << " is not a floating type";
  }
}
}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (dst_type == src_type) {
    std::memmove(dst, src, n * dtype_size(dst_type));
    return;
  }
  if (dst_type == DType::bf16 && src_type == DType::f32) {
    auto* d = static_cast<bf16_t*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (dst_type == DType::f32 && src_type == DType::bf16) {
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const bf16_t*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_float(dst, dst_type, i, load_float(src, src_type, i));
}

}  // namespace rn

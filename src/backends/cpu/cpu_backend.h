// The CPU backend: oneDNN primitives (and our own loops for NHWC batch norm), created once
// per descriptor and reused, fp32 and bf16 (bf16 only on CPUs with native bf16 support:
// AVX512-BF16 or AMX; elsewhere make_* throws rn::Unsupported saying so; fp16 never).
// Activations in nchw or nhwc; nhwc is the fast one (weights are reordered from PyTorch's
// OIHW into each primitive's preferred format at each call, which costs little next to the
// convolution; activations are reordered only around a Winograd convolution, whose kernel
// wants oneDNN's blocked layout).
//
// The kernels of one backend share one block of temporary memory (oneDNN scratchpads,
// reordered weights, a Winograd convolution's reordered activations, gradient staging),
// sized when the kernels are made: they must run
// one at a time, as a plan does. Two backends made by two make_cpu_backend() calls are
// independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ops/backend.h"

namespace rn {
struct CpuBackendOptions {
  // 3x3 stride-1 fp32 convolutions with channels in 16s (at least 64) and 50M+ multiply-adds
  // run as Winograd F(4x4, 3x3) on AVX-512 CPUs (about
  // twice as fast, activations reordered to oneDNN's blocked layout around them; relative
  // error ~1e-6 instead of ~1e-7): the high_performance implementation mode. false
  // (high_precision): direct convolutions only.
  bool winograd = true;
  // Batch norm over NHWC activations in our own loops (backends/cpu/batch_norm_nhwc.h: the
  // residual add+ReLU and the backward's ReLU mask folded into its passes). false: oneDNN's
  // batch norm with separate add+ReLU and mask passes, kept for comparisons (bench/micro).
  bool batch_norm_loops = true;
  // The arithmetic of ungrouped bf16 convolutions (backends/cpu/conv2d.cpp). native:
  // oneDNN's bf16 kernels. fp32: the same bf16 values widened (exactly) to fp32 for
  // oneDNN's fp32 kernels (Winograd included) and the result rounded back to bf16.
  // automatic (default): native where oneDNN may use AMX; elsewhere, whose bf16 dot
  // products are no faster than its fp32 FMAs, fp32 for the convolutions that do enough
  // multiply-adds per activation element to pay for the conversions, native for the rest.
  enum class Bf16ConvArithmetic : uint8_t { automatic, native, fp32 };
  Bf16ConvArithmetic bf16_conv_arithmetic = Bf16ConvArithmetic::automatic;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});
// True when this CPU runs bf16 natively; otherwise *why says what is missing.
bool cpu_has_native_bf16(std::string* why);
// True when oneDNN has a Winograd kernel for this CPU (its only one needs AVX-512,
// avx512_core, within the ISA oneDNN dispatches to, ONEDNN_MAX_CPU_ISA included).
bool cpu_has_winograd();
// True when oneDNN may use AMX (avx512_core_amx) on this CPU: its bf16 tile multiplies.
bool cpu_has_amx();
// The oneDNN library loaded at run time: "2.7.3" (the version, not its git hash).
std::string onednn_version();
}  // namespace rn

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
  // The arithmetic of ungrouped bf16 convolutions (rn::Bf16ConvArithmetic,
  // backends/cpu/conv2d.cpp). automatic (default): native on AMX CPUs. Elsewhere it follows
  // bf16_speedup: where bf16 dot products run at least as fast as fp32 FMAs (dev-2c's AMD
  // EPYC: about twice), native; where slower (dev-2c-xeon: 0.6x), fp32 for the convolutions
  // that do enough multiply-adds per activation element to pay for the conversions.
  using Bf16ConvArithmetic = rn::Bf16ConvArithmetic;
  Bf16ConvArithmetic bf16_conv_arithmetic = Bf16ConvArithmetic::automatic;
  // What automatic goes by: oneDNN's bf16 GEMM rate over its fp32 one on this CPU. 0 (default):
  // measured (cpu_bf16_speedup()) at the first bf16 convolution automatic decides, except on
  // AMX CPUs; tests set it to decide as another CPU would.
  double bf16_speedup = 0;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});
// True when this CPU runs bf16 natively; otherwise *why says what is missing.
bool cpu_has_native_bf16(std::string* why);
// True when oneDNN has a Winograd kernel for this CPU (its only one needs AVX-512,
// avx512_core, within the ISA oneDNN dispatches to, ONEDNN_MAX_CPU_ISA included).
bool cpu_has_winograd();
// True when oneDNN may use AMX (avx512_core_amx) on this CPU: its bf16 tile multiplies.
bool cpu_has_amx();
// How many times faster oneDNN multiplies in bf16 than in fp32 here: a [2048, 256] x
// [256, 256] GEMM in each (fp32 accumulation), the best of 5 calls after 2 warm-ups, at the
// current OpenMP thread count. Measured once per process and thread count (about 20 ms; the
// result is logged), then cached. Needs native bf16 (cpu_has_native_bf16).
double cpu_bf16_speedup();
// The oneDNN library loaded at run time: "2.7.3" (the version, not its git hash).
std::string onednn_version();
}  // namespace rn

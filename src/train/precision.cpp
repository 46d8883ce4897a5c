#include "train/precision.h"

#include <fmt/format.h>

namespace rn {

PrecisionPolicy intended_precision_policy(const PrecisionConfig& cfg) {
  PrecisionPolicy p;
  p.level = cfg.level;
  p.half = cfg.half_dtype;
  p.loss_scale = cfg.loss_scale;
  if (cfg.level == PrecisionLevel::O0) return p;
  p.conv_dtype = p.half;
  p.activation_dtype = cfg.level == PrecisionLevel::O1 ? DType::f32 : p.half;
  p.round_master_to_half = cfg.level == PrecisionLevel::O3;
  return p;
}

PrecisionPolicy make_precision_policy(const PrecisionConfig& cfg, const Backend& backend) {
  PrecisionPolicy p = intended_precision_policy(cfg);
  if (cfg.level == PrecisionLevel::O0) {
    p.loss_scale.policy = LossScalePolicy::none;
    return p;
  }
  RN_CHECK(p.half == DType::bf16 || p.half == DType::f16)
      << "precision.half_dtype must be bf16 or fp16, got " << dtype_name(p.half);
  if (backend.device() == Device::cpu && p.half == DType::f16)
    RN_FAIL() << "precision.half_dtype=fp16 is not available on the CPU: oneDNN has no fp16 training kernels for x86 "
                 "CPUs (fp16 is a GPU format). Use precision.half_dtype=bf16 (same 16-bit storage, fp32 range, no "
                 "loss scaling needed) or precision.level=O0";
  std::string why;
  if (!backend.supports_dtype(p.half, &why))
    RN_FAIL() << "precision.level=" << enum_name(cfg.level) << " with " << dtype_name(p.half) << " cannot run on the '"
              << backend.name() << "' backend: " << why << ". Use precision.level=O0 (fp32)";
  return p;
}

std::string PrecisionPolicy::describe() const {
  const auto h = dtype_name(half);
  std::string what;
  switch (level) {
    case PrecisionLevel::O0: what = "fp32 everywhere"; break;
    case PrecisionLevel::O1: what = fmt::format("{} convolutions and linear layers; BN, activations, loss and master weights fp32", h); break;
    case PrecisionLevel::O2: what = fmt::format("{} model (activations, conv/linear weights); BN, loss and master weights fp32", h); break;
    case PrecisionLevel::O3: what = fmt::format("pure {}: activations and weights in {}; BN statistics and loss fp32", h, h); break;
  }
  std::string scale;
  switch (loss_scale.policy) {
    case LossScalePolicy::none: scale = "loss scale: none"; break;
    case LossScalePolicy::static_scale: scale = fmt::format("loss scale: static {}", loss_scale.initial); break;
    case LossScalePolicy::dynamic:
      scale = fmt::format("loss scale: dynamic (initial {}, growth x{} every {} clean steps, backoff x{})",
                          loss_scale.initial, loss_scale.growth_factor, loss_scale.growth_interval,
                          loss_scale.backoff_factor);
      break;
  }
  return fmt::format("precision {}: {}; {}", enum_name(level), what, scale);
}

}  // namespace rn

// The parameter table. All trainable parameters live in one flat fp32 buffer (and so
// do their gradients and each optimizer state), ordered by when backward produces each
// gradient: the last layer's parameters come first. A ParamView names one tensor's range.
// Non-trainable state (BN running mean/var) lives in a separate flat buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace rn {

enum class ParamKind : uint8_t { conv_weight, conv_bias, linear_weight, linear_bias, bn_gamma, bn_beta };
std::string_view param_kind_name(ParamKind k);

struct ParamView {
  std::string name;     // torchvision's name, e.g. "layer1.0.conv1.weight"
  ParamKind kind;
  Shape shape;
  int64_t offset = 0;   // in elements, into the flat buffer; aligned to 16 elements
  int64_t numel = 0;
  bool weight_decay = true;  // false for BN parameters and biases unless configured
  bool lars_adapt = true;    // false for BN parameters and biases (LARS trust ratio skipped)
};

struct ParamTable {
  std::vector<ParamView> params;  // in gradient-production order
  int64_t total = 0;              // elements in the flat buffer (including alignment padding)

  const ParamView* find(const std::string& name) const;
};

}  // namespace rn

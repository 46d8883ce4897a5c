#include "model/params.h"

namespace rn {

std::string_view param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::conv_weight:
      return "conv_weight";
    case ParamKind::conv_bias:
      return "conv_bias";
    case ParamKind::linear_weight:
      return "linear_weight";
    case ParamKind::linear_bias:
      return "linear_bias";
    case ParamKind::bn_gamma:
      return "bn_gamma";
    case ParamKind::bn_beta:
      return "bn_beta";
  }
  return "unknown";
}

// A linear scan: tables hold a few hundred entries and lookups happen at setup time
// (weight import, tests), never in the training step.
const ParamView* ParamTable::find(const std::string& name) const {
  for (const ParamView& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace rn

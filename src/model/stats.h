// Static facts about a model graph: parameters and forward multiply-accumulates.
#pragma once

#include <cstdint>

#include "model/graph.h"

namespace rn {

struct ModelStats {
  int64_t conv_layers = 0, bn_layers = 0, linear_layers = 0;
  int64_t macs = 0;  // forward multiply-accumulates per sample (convs and linear layers)
};

ModelStats model_stats(const Graph& g);

}  // namespace rn

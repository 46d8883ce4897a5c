#include "model/stats.h"

namespace rn {

ModelStats model_stats(const Graph& g) {
  ModelStats s;
  for (const Node& n : g.nodes()) {
    if (const auto* c = attrs_if<ConvAttrs>(n)) {
      const Shape& in = g.node(n.inputs[0]).shape;
      Conv2dDesc d{c->p, 1, in[1], in[2], DType::f32, Layout::nchw};
      s.macs += d.macs();
      ++s.conv_layers;
    } else if (attrs_if<BatchNormAttrs>(n)) {
      ++s.bn_layers;
    } else if (const auto* l = attrs_if<LinearAttrs>(n)) {
      s.macs += l->in_features * l->out_features;
      ++s.linear_layers;
    }
  }
  return s;
}

}  // namespace rn

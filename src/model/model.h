// A model: its graph plus the flat buffers that outlive any plan: fp32 parameters
// (master weights), their gradients, and the non-trainable state (BN running stats).
// Plans for training and evaluation, at any batch size or memory level, share them.
#pragma once

#include <string>
#include <vector>

#include "model/graph.h"
#include "model/params.h"

namespace rn {

struct StateView {
  std::string name;  // "bn1.running_mean"
  Shape shape;
  int64_t offset = 0, numel = 0;
};

class Model {
 public:
  explicit Model(Graph graph, bool decay_bn_and_bias = false);

  const Graph& graph() const { return graph_; }
  const ParamTable& params() const { return params_; }
  const std::vector<StateView>& state_views() const { return state_; }

  // Indices into params().params / state_views() for node `id` (-1 if absent).
  struct NodeSlots {
    int weight = -1, bias = -1;              // conv/linear weight and bias, BN gamma and beta
    int running_mean = -1, running_var = -1;  // BN
  };
  const NodeSlots& slots(int node) const { return slots_.at(static_cast<size_t>(node)); }

  float* param_data() const { return static_cast<float*>(param_buf_.data()); }
  float* grad_data() const { return static_cast<float*>(grad_buf_.data()); }
  float* state_data() const { return static_cast<float*>(state_buf_.data()); }
  int64_t param_count() const;  // trainable elements, without alignment padding

  Tensor param(int index) const;
  Tensor grad(int index) const;
  Tensor state(int index) const;
  // Tensor by torchvision name (parameters and running stats); throws naming the name.
  Tensor named(const std::string& name) const;
  std::vector<std::string> names() const;  // parameters then state, in table order

  // torchvision's initialisation: conv kaiming normal (fan_out, relu); BN gamma 1 (0 where
  // zero_init), beta 0, running mean 0, var 1; linear U(-1/sqrt(in), 1/sqrt(in)).
  void init(uint64_t seed);
  void zero_grads();

 private:
  Graph graph_;
  ParamTable params_;
  std::vector<StateView> state_;
  std::vector<NodeSlots> slots_;
  HostBuffer param_buf_, grad_buf_, state_buf_;
};

}  // namespace rn

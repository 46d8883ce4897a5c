// A model: its graph plus the flat buffers that outlive any plan: fp32 parameters
// (master weights), their gradients, and the non-trainable state (BN running stats).
// Plans for training and evaluation, at any batch size or memory level, share them.
//
// The host buffers are what initialisation, weight I/O, checkpoints and the host optimizer
// use. A plan on a device backend places the model on that backend's MemorySpace
// (place_on): device copies of all three buffers are made and the plans compute on them
// (the compute_* accessors); to_host() / to_device() copy between the two explicitly. On
// the host, compute_* are the host buffers themselves and nothing is copied.
#pragma once

#include <string>
#include <vector>

#include "core/memory_space.h"
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
  // Zeroes the gradients the plans accumulate into (compute_grad_data()).
  void zero_grads();

  // Device placement (see above). place_on a host space is a no-op; placing a model that
  // is already on another device is an error.
  void place_on(MemorySpace& space);
  Device compute_device() const { return device_.space ? device_.space->device() : Device::cpu; }
  MemorySpace& compute_space() const { return device_.space ? *device_.space : host_memory(); }
  float* compute_param_data() const {
    return device_.space ? static_cast<float*>(device_.params.data()) : param_data();
  }
  float* compute_grad_data() const { return device_.space ? static_cast<float*>(device_.grads.data()) : grad_data(); }
  float* compute_state_data() const { return device_.space ? static_cast<float*>(device_.state.data()) : state_data(); }
  Tensor compute_param(int index) const;
  Tensor compute_grad(int index) const;
  Tensor compute_state(int index) const;
  // Copies parameters, gradients and state from the device to the host buffers / the
  // other way (no-ops for a host model).
  void to_host() const;
  void to_device() const;

 private:
  struct DeviceCopy {
    MemorySpace* space = nullptr;
    DeviceBuffer params, grads, state;
  };
  DeviceCopy device_;
  Graph graph_;
  ParamTable params_;
  std::vector<StateView> state_;
  std::vector<NodeSlots> slots_;
  HostBuffer param_buf_, grad_buf_, state_buf_;
};

}  // namespace rn

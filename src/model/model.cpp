#include "model/model.h"

#include <cmath>
#include <cstring>

#include "core/rng.h"

namespace rn {

namespace {
constexpr int64_t kParamAlign = 16;  // elements: every view starts on a 64-byte boundary
}

Model::Model(Graph graph, bool decay_bn_and_bias) : graph_(std::move(graph)) {
  const auto& nodes = graph_.nodes();
  slots_.resize(nodes.size());
  auto add_param = [&](const std::string& name, ParamKind kind, Shape shape, bool is_weight) {
    ParamView v;
    v.name = name;
    v.kind = kind;
    v.shape = shape;
    v.numel = shape.numel();
    v.offset = params_.total;
    v.weight_decay = is_weight || decay_bn_and_bias;
    v.lars_adapt = is_weight;
    params_.total += (v.numel + kParamAlign - 1) / kParamAlign * kParamAlign;
    params_.params.push_back(v);
    return static_cast<int>(params_.params.size()) - 1;
  };
  int64_t state_total = 0;
  auto add_state = [&](const std::string& name, Shape shape) {
    StateView v{name, shape, state_total, shape.numel()};
    state_total += (v.numel + kParamAlign - 1) / kParamAlign * kParamAlign;
    state_.push_back(v);
    return static_cast<int>(state_.size()) - 1;
  };
  // Parameters are laid out in the order backward produces their gradients: last node first.
  for (int id = static_cast<int>(nodes.size()) - 1; id >= 0; --id) {
    const Node& n = nodes[static_cast<size_t>(id)];
    NodeSlots& s = slots_[static_cast<size_t>(id)];
    if (const auto* c = attrs_if<ConvAttrs>(n)) {
      s.weight = add_param(n.name + ".weight", ParamKind::conv_weight,
                           {c->p.out_channels, c->p.in_channels / c->p.groups, c->p.kernel_h, c->p.kernel_w}, true);
      if (c->p.bias) s.bias = add_param(n.name + ".bias", ParamKind::conv_bias, {c->p.out_channels}, false);
    } else if (attrs_if<BatchNormAttrs>(n)) {
      const int64_t ch = n.shape[0];
      s.weight = add_param(n.name + ".weight", ParamKind::bn_gamma, {ch}, false);
      s.bias = add_param(n.name + ".bias", ParamKind::bn_beta, {ch}, false);
    } else if (const auto* l = attrs_if<LinearAttrs>(n)) {
      s.weight = add_param(n.name + ".weight", ParamKind::linear_weight, {l->out_features, l->in_features}, true);
      if (l->bias) s.bias = add_param(n.name + ".bias", ParamKind::linear_bias, {l->out_features}, false);
    }
  }
  for (size_t id = 0; id < nodes.size(); ++id) {
    if (attrs_if<BatchNormAttrs>(nodes[id])) {
      slots_[id].running_mean = add_state(nodes[id].name + ".running_mean", {nodes[id].shape[0]});
      slots_[id].running_var = add_state(nodes[id].name + ".running_var", {nodes[id].shape[0]});
    }
  }
  param_buf_ = HostBuffer(static_cast<size_t>(params_.total) * 4);
  grad_buf_ = HostBuffer(static_cast<size_t>(params_.total) * 4);
  state_buf_ = HostBuffer(static_cast<size_t>(state_total) * 4);
  param_buf_.zero();
  grad_buf_.zero();
  state_buf_.zero();
}

int64_t Model::param_count() const {
  int64_t n = 0;
  for (const auto& p : params_.params) n += p.numel;
  return n;
}

Tensor Model::param(int i) const {
  const ParamView& v = params_.params.at(static_cast<size_t>(i));
  return Tensor{param_data() + v.offset, v.shape, DType::f32};
}

Tensor Model::grad(int i) const {
  const ParamView& v = params_.params.at(static_cast<size_t>(i));
  return Tensor{grad_data() + v.offset, v.shape, DType::f32};
}

Tensor Model::state(int i) const {
  const StateView& v = state_.at(static_cast<size_t>(i));
  return Tensor{state_data() + v.offset, v.shape, DType::f32};
}

Tensor Model::named(const std::string& name) const {
  for (size_t i = 0; i < params_.params.size(); ++i)
    if (params_.params[i].name == name) return param(static_cast<int>(i));
  for (size_t i = 0; i < state_.size(); ++i)
    if (state_[i].name == name) return state(static_cast<int>(i));
  RN_FAIL() << "model '" << graph_.name << "' has no tensor named '" << name << "'";
}

std::vector<std::string> Model::names() const {
  std::vector<std::string> out;
  for (const auto& p : params_.params) out.push_back(p.name);
  for (const auto& s : state_) out.push_back(s.name);
  return out;
}

void Model::init(uint64_t seed) {
  Rng root(seed);
  const auto& nodes = graph_.nodes();
  for (size_t id = 0; id < nodes.size(); ++id) {
    const Node& n = nodes[id];
    const NodeSlots& s = slots_[id];
    Rng rng = root.fork(id);  // each node's values do not depend on the others
    if (const auto* c = attrs_if<ConvAttrs>(n)) {
      Tensor w = param(s.weight);
      const double fan_out = static_cast<double>(c->p.out_channels * c->p.kernel_h * c->p.kernel_w);
      const float stddev = static_cast<float>(std::sqrt(2.0 / fan_out));
      for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = stddev * rng.normal();
      if (s.bias >= 0) std::memset(param(s.bias).data, 0, param(s.bias).bytes());
    } else if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
      Tensor g = param(s.weight), be = param(s.bias);
      for (int64_t i = 0; i < g.numel(); ++i) g.ptr<float>()[i] = b->zero_init ? 0.0f : 1.0f;
      std::memset(be.data, 0, be.bytes());
      Tensor rm = state(s.running_mean), rv = state(s.running_var);
      std::memset(rm.data, 0, rm.bytes());
      for (int64_t i = 0; i < rv.numel(); ++i) rv.ptr<float>()[i] = 1.0f;
    } else if (const auto* l = attrs_if<LinearAttrs>(n)) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(l->in_features));
      Tensor w = param(s.weight);
      for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = rng.uniform(-bound, bound);
      if (s.bias >= 0) {
        Tensor bb = param(s.bias);
        for (int64_t i = 0; i < bb.numel(); ++i) bb.ptr<float>()[i] = rng.uniform(-bound, bound);
      }
    }
  }
}

void Model::zero_grads() {
  if (device_.space)
    device_.grads.zero();
  else
    grad_buf_.zero();
}

void Model::place_on(MemorySpace& space) {
  if (space.device() == Device::cpu) {
    RN_CHECK(!device_.space) << "model '" << graph_.name << "' is on " << device_name(compute_device())
                             << "; a host plan cannot use it";
    return;
  }
  if (device_.space == &space) return;
  RN_CHECK(!device_.space) << "model '" << graph_.name << "' is already placed on another device";
  device_.space = &space;
  device_.params = DeviceBuffer(space, param_buf_.bytes());
  device_.grads = DeviceBuffer(space, grad_buf_.bytes());
  device_.state = DeviceBuffer(space, state_buf_.bytes());
  to_device();
}

void Model::to_host() const {
  if (!device_.space) return;
  device_.space->copy(param_buf_.data(), device_.params.data(), param_buf_.bytes());
  device_.space->copy(grad_buf_.data(), device_.grads.data(), grad_buf_.bytes());
  device_.space->copy(state_buf_.data(), device_.state.data(), state_buf_.bytes());
}

void Model::to_device() const {
  if (!device_.space) return;
  device_.space->copy(device_.params.data(), param_buf_.data(), param_buf_.bytes());
  device_.space->copy(device_.grads.data(), grad_buf_.data(), grad_buf_.bytes());
  device_.space->copy(device_.state.data(), state_buf_.data(), state_buf_.bytes());
}

Tensor Model::compute_param(int i) const {
  const ParamView& v = params_.params.at(static_cast<size_t>(i));
  Tensor t{compute_param_data() + v.offset, v.shape, DType::f32};
  t.device = compute_device();
  return t;
}

Tensor Model::compute_grad(int i) const {
  const ParamView& v = params_.params.at(static_cast<size_t>(i));
  Tensor t{compute_grad_data() + v.offset, v.shape, DType::f32};
  t.device = compute_device();
  return t;
}

Tensor Model::compute_state(int i) const {
  const StateView& v = state_.at(static_cast<size_t>(i));
  Tensor t{compute_state_data() + v.offset, v.shape, DType::f32};
  t.device = compute_device();
  return t;
}

}  // namespace rn

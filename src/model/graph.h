// A static model graph: nodes in topological order, each producing one value. Shapes
// are per sample ({C, H, W} or {F}); the batch size is chosen when a plan is made.
// Node attributes are typed per kind (no struct carrying every layer's fields).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/pool.h"

namespace rn {

struct InputAttrs {};
struct ConvAttrs {
  Conv2dParams p;
};
struct BatchNormAttrs {
  BnFuse fuse = BnFuse::none;
  float eps = 1e-5f, momentum = 0.1f;
  bool zero_init = false;  // gamma starts at 0 (last BN of a residual block, optional)
};
struct ReluAttrs {};
struct MaxPoolAttrs {
  int64_t kernel = 3, stride = 2, pad = 1;
};
struct GlobalAvgPoolAttrs {};
struct LinearAttrs {
  int64_t in_features = 0, out_features = 0;
  bool bias = true;
};

using NodeAttrs =
    std::variant<InputAttrs, ConvAttrs, BatchNormAttrs, ReluAttrs, MaxPoolAttrs, GlobalAvgPoolAttrs, LinearAttrs>;

struct Node {
  std::string name;         // parameter prefix, torchvision style: "layer1.0.conv1"
  NodeAttrs attrs;
  std::vector<int> inputs;  // value ids (= producing node ids); BN add_relu: {x, residual}
  Shape shape;              // output shape per sample
};

class Graph {
 public:
  // Builder: each returns the id of the new node (which is also its output value id).
  int input(int64_t channels, int64_t height, int64_t width);
  int conv(int x, const std::string& name, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad,
           int64_t groups = 1, bool bias = false);
  int batch_norm(int x, const std::string& name, BnFuse fuse = BnFuse::none, int residual = -1,
                 bool zero_init = false);
  int relu(int x, const std::string& name);
  int max_pool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad);
  int global_avg_pool(int x, const std::string& name);
  int linear(int x, const std::string& name, int64_t out_features, bool bias = true);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  int output() const { return static_cast<int>(nodes_.size()) - 1; }
  // consumers()[v] lists the nodes reading value v, in order.
  std::vector<std::vector<int>> consumers() const;

  std::string name;  // the zoo name ("resnet50")

 private:
  int add(Node n);
  const Shape& shape_of(int v) const;
  std::vector<Node> nodes_;
};

template <typename T>
const T* attrs_if(const Node& n) {
  return std::get_if<T>(&n.attrs);
}

}  // namespace rn

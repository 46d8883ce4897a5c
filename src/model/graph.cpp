#include "model/graph.h"

namespace rn {

int Graph::add(Node n) {
  for (int v : n.inputs)
    RN_CHECK(v >= 0 && v < static_cast<int>(nodes_.size())) << "node '" << n.name << "' reads unknown value " << v;
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

const Shape& Graph::shape_of(int v) const {
  RN_CHECK(v >= 0 && v < static_cast<int>(nodes_.size())) << "unknown value " << v;
  return nodes_[static_cast<size_t>(v)].shape;
}

int Graph::input(int64_t channels, int64_t height, int64_t width) {
  RN_CHECK(nodes_.empty()) << "the input must be the first node";
  RN_CHECK(channels > 0 && height > 0 && width > 0) << "input shape must be positive";
  // The plan multiplies this by the batch size; one sample must fit at least (in fp32, the
  // widest activation dtype).
  RN_CHECK(shape_bytes_fit({channels, height, width}, DType::f32))
      << "input shape " << channels << "x" << height << "x" << width
      << " has more bytes than a 64-bit size holds: lower the input size";
  return add({"input", InputAttrs{}, {}, {channels, height, width}});
}

int Graph::conv(int x, const std::string& name, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad,
                int64_t groups, bool bias) {
  const Shape& s = shape_of(x);
  RN_CHECK(s.rank() == 3) << "conv '" << name << "' needs a [C, H, W] input, got " << s.str();
  ConvAttrs a;
  a.p.in_channels = s[0];
  a.p.out_channels = out_channels;
  a.p.kernel_h = a.p.kernel_w = kernel;
  a.p.stride_h = a.p.stride_w = stride;
  a.p.pad_h = a.p.pad_w = pad;
  a.p.groups = groups;
  a.p.bias = bias;
  Conv2dDesc d{a.p, 1, s[1], s[2], DType::f32, Layout::nchw};
  d.validate();
  return add({name, a, {x}, {out_channels, d.out_h(), d.out_w()}});
}

int Graph::batch_norm(int x, const std::string& name, BnFuse fuse, int residual, bool zero_init) {
  const Shape& s = shape_of(x);
  RN_CHECK(s.rank() == 3) << "batch_norm '" << name << "' needs a [C, H, W] input, got " << s.str();
  RN_CHECK((residual >= 0) == (fuse == BnFuse::add_relu)) << "batch_norm '" << name
                                                          << "': a residual is given iff fuse is add_relu";
  std::vector<int> inputs = {x};
  if (residual >= 0) {
    RN_CHECK(shape_of(residual) == s) << "batch_norm '" << name << "': residual " << shape_of(residual).str()
                                      << " does not match " << s.str();
    inputs.push_back(residual);
  }
  BatchNormAttrs a;
  a.fuse = fuse;
  a.zero_init = zero_init;
  return add({name, a, inputs, s});
}

int Graph::relu(int x, const std::string& name) { return add({name, ReluAttrs{}, {x}, shape_of(x)}); }

int Graph::max_pool(int x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad) {
  const Shape& s = shape_of(x);
  RN_CHECK(s.rank() == 3) << "max_pool '" << name << "' needs a [C, H, W] input";
  MaxPoolDesc d;
  d.channels = s[0];
  d.in_h = s[1];
  d.in_w = s[2];
  d.kernel = kernel;
  d.stride = stride;
  d.pad = pad;
  d.validate();
  return add({name, MaxPoolAttrs{kernel, stride, pad}, {x}, {s[0], d.out_h(), d.out_w()}});
}

int Graph::global_avg_pool(int x, const std::string& name) {
  const Shape& s = shape_of(x);
  RN_CHECK(s.rank() == 3) << "global_avg_pool '" << name << "' needs a [C, H, W] input";
  return add({name, GlobalAvgPoolAttrs{}, {x}, {s[0]}});
}

int Graph::linear(int x, const std::string& name, int64_t out_features, bool bias) {
  const Shape& s = shape_of(x);
  RN_CHECK(s.rank() == 1) << "linear '" << name << "' needs a [F] input, got " << s.str();
  RN_CHECK(out_features > 0) << "linear '" << name << "' needs out_features > 0";
  return add({name, LinearAttrs{s[0], out_features, bias}, {x}, {out_features}});
}

std::vector<std::vector<int>> Graph::consumers() const {
  std::vector<std::vector<int>> c(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (int v : nodes_[i].inputs) c[static_cast<size_t>(v)].push_back(static_cast<int>(i));
  return c;
}

}  // namespace rn

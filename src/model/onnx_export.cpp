#include "model/onnx_export.h"

#include <cstring>
#include <set>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/rng.h"
#include "model/graph.h"
#include "model/plan.h"

#ifdef RN_HAVE_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#endif

namespace rn {

#ifndef RN_HAVE_ONNX

bool onnx_export_available() { return false; }

OnnxExportInfo save_onnx(const std::string& path, const Model&) {
  throw Unsupported("cannot write " + path +
                    ": this build has no ONNX support (install libonnx-dev and "
                    "libprotobuf-dev, then reconfigure)");
}

#else

bool onnx_export_available() { return true; }

namespace {

std::vector<int64_t> dims_of(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

class OnnxWriter {
 public:
  explicit OnnxWriter(const Model& model) : model_(model), graph_(*proto_.mutable_graph()) {}

  onnx::ModelProto build() {
    const Graph& g = model_.graph();
    proto_.set_ir_version(onnx::IR_VERSION);
    proto_.set_producer_name("resnet.cpp");
    proto_.set_model_version(1);
    proto_.set_doc_string("inference graph of " + g.name + "; input normalised as in training (mean/std not included)");
    onnx::OperatorSetIdProto* opset = proto_.add_opset_import();
    opset->set_domain("");
    opset->set_version(kOnnxOpset);
    graph_.set_name(g.name.empty() ? "resnet" : g.name);

    names_.resize(g.nodes().size());
    for (size_t id = 0; id < g.nodes().size(); ++id) emit(static_cast<int>(id), g.nodes()[id]);

    const Node& last = g.node(g.output());
    RN_CHECK(last.shape.rank() == 1) << "ONNX export: the model's output '" << last.name << "' is " << last.shape.str()
                                     << ", expected [classes]";
    // The last value is renamed "logits": its producer writes that name directly.
    add_value_info(graph_.add_output(), "logits", {last.shape[0]});
    return std::move(proto_);
  }

  int initializers() const { return initializers_; }

 private:
  // A fresh name for the value a node produces (node names are unique in the zoo; a
  // repeated one gets a suffix rather than a silently shared value).
  std::string value_name(int id, const std::string& base) {
    if (id == model_.graph().output()) return "logits";
    std::string n = base;
    for (int k = 1; !used_.insert(n).second; ++k) n = base + "_" + std::to_string(k);
    return n;
  }

  void add_value_info(onnx::ValueInfoProto* v, const std::string& name, const std::vector<int64_t>& per_sample) {
    v->set_name(name);
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    onnx::TensorShapeProto* s = t->mutable_shape();
    s->add_dim()->set_dim_param("N");
    for (int64_t d : per_sample) s->add_dim()->set_dim_value(d);
  }

  // The parameter or running statistic `suffix` of node `n` as an initializer, by its
  // torchvision name ("layer1.0.conv1.weight").
  std::string initializer(const Node& n, const std::string& suffix) {
    const std::string name = n.name + "." + suffix;
    const Tensor t = model_.named(name);
    RN_CHECK(t.device == Device::cpu && t.dtype == DType::f32)
        << "ONNX export: " << name << " must be an fp32 tensor on the host";
    onnx::TensorProto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims_of(t.shape)) init->add_dims(d);
    init->set_raw_data(t.data, t.bytes());  // little-endian fp32, as ONNX's raw_data is
    used_.insert(name);
    ++initializers_;
    return name;
  }

  onnx::NodeProto* node(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                        const std::string& output) {
    onnx::NodeProto* p = graph_.add_node();
    p->set_op_type(op);
    p->set_name(name);
    for (auto& i : inputs) p->add_input(i);
    p->add_output(output);
    return p;
  }

  static void ints(onnx::NodeProto* p, const char* name, std::vector<int64_t> v) {
    onnx::AttributeProto* a = p->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void integer(onnx::NodeProto* p, const char* name, int64_t v) {
    onnx::AttributeProto* a = p->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void real(onnx::NodeProto* p, const char* name, float v) {
    onnx::AttributeProto* a = p->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  const std::string& in(const Node& n, size_t k) const { return names_.at(static_cast<size_t>(n.inputs.at(k))); }

  void emit(int id, const Node& n) {
    std::string& out = names_[static_cast<size_t>(id)];
    if (attrs_if<InputAttrs>(n)) {
      out = value_name(id, "input");
      add_value_info(graph_.add_input(), out, dims_of(n.shape));
    } else if (const auto* c = attrs_if<ConvAttrs>(n)) {
      const Conv2dParams& p = c->p;
      std::vector<std::string> inputs = {in(n, 0), initializer(n, "weight")};
      if (p.bias) inputs.push_back(initializer(n, "bias"));
      out = value_name(id, n.name);
      onnx::NodeProto* q = node("Conv", n.name, inputs, out);
      ints(q, "kernel_shape", {p.kernel_h, p.kernel_w});
      ints(q, "strides", {p.stride_h, p.stride_w});
      ints(q, "pads", {p.pad_h, p.pad_w, p.pad_h, p.pad_w});
      ints(q, "dilations", {p.dilation_h, p.dilation_w});
      integer(q, "group", p.groups);
    } else if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
      const std::vector<std::string> inputs = {in(n, 0), initializer(n, "weight"), initializer(n, "bias"),
                                               initializer(n, "running_mean"), initializer(n, "running_var")};
      if (b->fuse == BnFuse::none) {
        out = value_name(id, n.name);
        real(node("BatchNormalization", n.name, inputs, out), "epsilon", b->eps);
        return;
      }
      // The fused forms as the ops they fuse: relu(bn(x)), relu(bn(x) + residual).
      const std::string bn_out = value_name(-1, n.name + ".bn");
      real(node("BatchNormalization", n.name, inputs, bn_out), "epsilon", b->eps);
      std::string relu_in = bn_out;
      if (b->fuse == BnFuse::add_relu) {
        relu_in = value_name(-1, n.name + ".add");
        node("Add", n.name + ".add", {bn_out, in(n, 1)}, relu_in);
      }
      out = value_name(id, n.name);
      node("Relu", n.name + ".relu", {relu_in}, out);
    } else if (attrs_if<ReluAttrs>(n)) {
      out = value_name(id, n.name);
      node("Relu", n.name, {in(n, 0)}, out);
    } else if (const auto* m = attrs_if<MaxPoolAttrs>(n)) {
      out = value_name(id, n.name);
      onnx::NodeProto* q = node("MaxPool", n.name, {in(n, 0)}, out);
      ints(q, "kernel_shape", {m->kernel, m->kernel});
      ints(q, "strides", {m->stride, m->stride});
      ints(q, "pads", {m->pad, m->pad, m->pad, m->pad});
    } else if (attrs_if<GlobalAvgPoolAttrs>(n)) {
      // Ours gives [N, C]; ONNX's keeps [N, C, 1, 1], flattened here.
      const std::string pooled = value_name(-1, n.name + ".pool");
      node("GlobalAveragePool", n.name, {in(n, 0)}, pooled);
      out = value_name(id, n.name);
      integer(node("Flatten", n.name + ".flatten", {pooled}, out), "axis", 1);
    } else if (const auto* l = attrs_if<LinearAttrs>(n)) {
      std::vector<std::string> inputs = {in(n, 0), initializer(n, "weight")};
      if (l->bias) inputs.push_back(initializer(n, "bias"));
      out = value_name(id, n.name);
      integer(node("Gemm", n.name, inputs, out), "transB", 1);
    } else {
      RN_CHECK(false) << "ONNX export: node '" << n.name << "' has a kind the exporter does not know";
    }
  }

  const Model& model_;
  onnx::ModelProto proto_;
  onnx::GraphProto& graph_;
  std::vector<std::string> names_;  // value id -> ONNX value name
  std::set<std::string> used_;
  int initializers_ = 0;
};

}  // namespace

OnnxExportInfo save_onnx(const std::string& path, const Model& model) {
  OnnxWriter writer(model);
  onnx::ModelProto proto = writer.build();
  OnnxExportInfo info;
  info.nodes = proto.graph().node_size();
  info.initializers = writer.initializers();
  try {
    onnx::checker::check_model(proto);
    onnx::shape_inference::InferShapes(proto);  // refuses inconsistent shapes (strict mode off: fills value_info)
  } catch (const std::exception& e) {
    throw Error("ONNX export of " + model.graph().name + " to " + path + " failed ONNX's checks: " + e.what());
  }
  std::string bytes;
  RN_CHECK(proto.SerializeToString(&bytes)) << "ONNX export: serialising " << path << " failed";
  write_file_atomic(path, bytes);
  info.bytes = bytes.size();
  return info;
}

#endif

ExportSample export_sample(Model& model, Backend& backend, int64_t batch, uint64_t seed) {
  PlanOptions po;
  po.batch = batch;
  po.layout = Layout::nchw;
  po.mode = PlanMode::eval;
  Plan plan(model, &backend, po);
  ExportSample s;
  s.input = HostTensor(plan.input().shape, DType::f32, Layout::nchw);
  Rng rng(seed);
  for (int64_t i = 0; i < s.input.numel(); ++i) s.input.ptr<float>()[i] = rng.normal();
  plan.copy_from_host(plan.input(), s.input.view().data);
  const std::vector<int32_t> labels(static_cast<size_t>(batch), 0);  // the plan's loss reads them
  plan.copy_from_host(plan.labels(), labels.data());
  plan.forward();
  s.logits = HostTensor(plan.logits().shape, DType::f32);
  plan.copy_to_host(s.logits.view().data, plan.logits());
  return s;
}

}  // namespace rn

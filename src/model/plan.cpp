#include "model/plan.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "core/nvtx.h"

namespace rn {

namespace {
template <typename K>
K* keep(std::vector<std::unique_ptr<K>>& owner, std::unique_ptr<K> k) {
  owner.push_back(std::move(k));
  return owner.back().get();
}
}  // namespace

Plan::Plan(Model& model, Backend* backend, const PlanOptions& options)
    : model_(model), backend_(backend), options_(options) {
  RN_CHECK(options.batch > 0) << "plan: batch must be positive, got " << options.batch;
  for (DType t : {options.dtype, options.activation_dtype}) {
    RN_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16)
        << "plan: compute dtypes must be fp32, bf16 or fp16, got " << dtype_name(t);
    std::string why;
    if (backend_ && !backend_->supports_dtype(t, &why))
      RN_UNSUPPORTED() << "backend '" << backend_->name() << "' cannot compute in " << dtype_name(t) << ": " << why;
  }
  const size_t n = model.graph().nodes().size();
  act_.assign(n, -1);
  grad_.assign(n, -1);
  half_grad_.assign(n, false);
  saved0_.assign(n, -1);
  saved1_.assign(n, -1);
  x_in_.assign(n, -1);
  kernels_.assign(n, {});

  build_forward();
  if (options_.mode == PlanMode::train) build_backward();

  // Each buffer fits (add_buffer); their sum bounds the arena, so if it fits the memory plan's
  // offsets cannot wrap.
  int64_t all_bytes = 0;
  for (const BufferSpec& b : buffers_)
    if (__builtin_add_overflow(all_bytes, static_cast<int64_t>(align_up(b.bytes, Arena::kAlignment)), &all_bytes))
      RN_FAIL() << "plan: the buffers of the plan for batch " << options_.batch
                << " need more bytes than a 64-bit size holds: lower the batch size or the input size";
  arena_bytes_ = plan_memory(buffers_, options_.memory, num_steps());
  validate_plan(buffers_, arena_bytes_, num_steps());
  if (!backend_ || !options_.allocate) return;

  // Everything the steps touch lives in the backend's memory (the device for a GPU backend).
  MemorySpace& space = backend_->memory();
  model_.place_on(space);
  try {
    arena_ = Arena(arena_bytes_, space);
  } catch (const Error& e) {
    RN_FAIL() << "the training plan for batch " << options_.batch << " at memory level "
              << memory_level_name(options_.memory) << " needs an arena of " << arena_bytes_ / 1048576 << " MiB on "
              << backend_->name() << ", which cannot be allocated (" << e.what()
              << "): lower the batch size or use memory level O2 (`resnet info --batch N` plans each level, "
                 "`resnet bench --find-max-batch --memory-cap SIZE` finds the largest batch that fits)";
  }
  if (space.device() == Device::cpu)
    release_pages(arena_.base(), arena_.bytes());  // untouched until a step writes it: measurable
  views_.resize(buffers_.size());
  for (size_t i = 0; i < buffers_.size(); ++i)
    views_[i] = arena_.view(buffers_[i].offset, meta_[i].shape, meta_[i].dtype, meta_[i].layout);
  if (options_.dtype != DType::f32)
    half_weights_ = DeviceBuffer(space, static_cast<size_t>(model_.params().total) * dtype_size(options_.dtype));
}

Plan::~Plan() = default;

int Plan::add_buffer(const std::string& name, Shape shape, DType dtype, Layout layout, BufferRole role,
                     bool persistent) {
  // Every size past this point (the memory plan, views, kernels) assumes the bytes fit.
  RN_CHECK(shape_bytes_fit(shape, dtype))
      << "plan: '" << name << "' (" << dtype_name(dtype) << " " << shape.str() << ") at batch " << options_.batch
      << " has more bytes than a 64-bit size holds: lower the batch size or the input size";
  BufferSpec b;
  b.name = name;
  b.bytes = shape_bytes(shape, dtype);
  b.persistent = persistent;
  buffers_.push_back(b);
  meta_.push_back({shape, dtype, layout, role});
  return static_cast<int>(buffers_.size()) - 1;
}

void Plan::add_step(std::string name, std::initializer_list<int> reads, std::initializer_list<int> writes,
                    std::function<void()> run) {
  const int index = static_cast<int>(steps_.size());
  for (int r : reads) {
    BufferSpec& b = buffers_[static_cast<size_t>(r)];
    RN_CHECK(b.persistent || b.first >= 0) << "plan: step '" << name << "' reads '" << b.name << "' before it is written";
    b.last = std::max(b.last, index);
  }
  for (int w : writes) {
    BufferSpec& b = buffers_[static_cast<size_t>(w)];
    if (b.first < 0) b.first = index;
    b.last = std::max(b.last, index);
  }
  steps_.push_back({std::move(name), std::move(run), {}, reads, writes});
}

Plan::StepBytes Plan::step_bytes(int i) const {
  const Step& s = steps_.at(static_cast<size_t>(i));
  StepBytes b;
  for (int r : s.reads) b.read += buffers_[static_cast<size_t>(r)].bytes;
  for (int w : s.writes) b.written += buffers_[static_cast<size_t>(w)].bytes;
  return b;
}

void Plan::mark_finishes(int weight, int bias) {
  for (int p : {weight, bias})
    if (p >= 0) steps_.back().finishes.push_back(p);
}

Tensor Plan::weight(int param_index) const {
  // Convolution and linear weights in options().dtype: the master or its half copy.
  Tensor master = model_.compute_param(param_index);
  if (options_.dtype == DType::f32) return master;
  const ParamView& v = model_.params().params[static_cast<size_t>(param_index)];
  Tensor t = master;
  t.dtype = options_.dtype;
  t.data = static_cast<char*>(half_weights_.data()) + static_cast<size_t>(v.offset) * dtype_size(options_.dtype);
  return t;
}

void Plan::build_forward() {
  const Graph& g = model_.graph();
  const int64_t N = options_.batch;
  if (options_.dtype != DType::f32) {
    // One cast of all master weights into the half copy per step.
    CastKernel* cast = nullptr;
    if (backend_)
      cast = keep(casts_, backend_->make_cast({model_.params().total, DType::f32, options_.dtype}));
    add_step("cast weights", {}, {}, [this, cast] {
      const int64_t total = model_.params().total;
      Tensor src{model_.compute_param_data(), {total}, DType::f32};
      Tensor dst{half_weights_.data(), {total}, options_.dtype};
      src.device = dst.device = model_.compute_device();
      cast->forward(dst, src);
    });
  }
  readers_ = g.consumers();
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) emit_forward(id);

  // Logits to fp32 for the loss, then the loss itself.
  const int out = g.output();
  const int64_t K = g.node(out).shape[0];
  logits_ = value_as(out, DType::f32);
  buffers_[static_cast<size_t>(logits_)].persistent = true;
  labels_ = add_buffer("labels", {N}, DType::i32, Layout::nchw, BufferRole::io, true);
  loss_ = add_buffer("loss", {1}, DType::f32, Layout::nchw, BufferRole::io, true);
  probs_ = add_buffer("probs", {N, K}, DType::f32, Layout::nchw, BufferRole::saved, true);
  SoftmaxCrossEntropyDesc ld{N, K, options_.label_smoothing};
  ld.validate();
  if (backend_) loss_kernel_ = backend_->make_softmax_cross_entropy(ld);
  add_step("fwd loss", {logits_, labels_}, {loss_, probs_},
           [this] { loss_kernel_->forward(view(loss_), view(probs_), view(logits_), view(labels_)); });
  forward_steps_ = num_steps();
}

void Plan::emit_forward(int id) {
  const Graph& g = model_.graph();
  const Node& n = g.node(id);
  const int64_t N = options_.batch;
  const DType dt = node_dtype(id);
  const Layout L = options_.layout;
  const Model::NodeSlots& s = model_.slots(id);
  const bool train = options_.mode == PlanMode::train;
  auto act_shape = [&](const Shape& per_sample) {
    return per_sample.rank() == 3 ? Shape{N, per_sample[0], per_sample[1], per_sample[2]} : Shape{N, per_sample[0]};
  };
  auto in = [&](int i) { return value_as(n.inputs[static_cast<size_t>(i)], dt); };
  int& y = act_[static_cast<size_t>(id)];

  if (attrs_if<InputAttrs>(n)) {
    y = input_ = add_buffer("input", act_shape(n.shape), dt, L, BufferRole::io, true);
    return;
  }
  // O1's fused casts. A convolution writes fp32 y where what reads it computes in fp32 (batch
  // norm, in every model of the zoo; a convolution or linear layer reading it would need a
  // cast back to the half type), and fp32 dx where its input is an fp32 value. A batch norm
  // writes a half y where one half convolution or linear layer alone reads it (it would read
  // a cast of it; with two readers, as where a stage's first block and its downsampling both
  // read the previous block's output, their gradients are summed in fp32, so the cast stays),
  // and a half dx where its input is the fp32 output of a convolution that nothing else
  // reads (whose backward would read a cast of that gradient).
  const std::vector<int>& mine = readers_[static_cast<size_t>(id)];
  const bool conv = attrs_if<ConvAttrs>(n) != nullptr;
  const auto* bn_attrs = attrs_if<BatchNormAttrs>(n);
  const auto half_reader = [&](int c) {
    const NodeAttrs& a = g.node(c).attrs;
    return std::holds_alternative<ConvAttrs>(a) || std::holds_alternative<LinearAttrs>(a);
  };
  const bool f32_y = conv && conv_f32_outputs() &&
                     std::all_of(mine.begin(), mine.end(), [&](int c) { return node_dtype(c) == DType::f32; });
  const int xv = n.inputs.empty() ? -1 : n.inputs[0];
  const bool x_f32 = xv > 0 && meta_[static_cast<size_t>(act_[static_cast<size_t>(xv)])].dtype == DType::f32;
  const bool f32_dx = conv && conv_f32_outputs() && x_f32;
  const bool half_y = bn_attrs != nullptr && bn_half_io() && mine.size() == 1 && half_reader(mine[0]);
  // (In an evaluation plan too, where nothing reads dx: the descriptor is then the training
  // plan's, and with the ReLU alone half_y needs it.)
  const bool half_dx = bn_attrs != nullptr && bn_half_io() && x_f32 && attrs_if<ConvAttrs>(g.node(xv)) != nullptr &&
                       readers_[static_cast<size_t>(xv)].size() == 1 && (bn_attrs->fuse != BnFuse::relu || half_y);
  const DType y_dt = f32_y ? DType::f32 : half_y ? options_.dtype : dt;
  y = add_buffer(n.name + ":y", act_shape(n.shape), y_dt, L, BufferRole::activation);
  const int x = x_in_[static_cast<size_t>(id)] = in(0);
  const Shape xs = meta_[static_cast<size_t>(x)].shape;

  if (const auto* c = attrs_if<ConvAttrs>(n)) {
    Conv2dDesc d{c->p, N, xs[2], xs[3], dt, L, f32_y, f32_dx};
    Conv2dKernel* k = kernels_[static_cast<size_t>(id)].conv = backend_ ? keep(convs_, backend_->make_conv2d(d)) : nullptr;
    add_step("fwd " + n.name, {x}, {y}, [this, k, x, y, s] {
      Tensor b = s.bias >= 0 ? model_.compute_param(s.bias) : Tensor{};
      k->forward(view(y), view(x), weight(s.weight), s.bias >= 0 ? &b : nullptr);
    });
  } else if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
    BatchNormDesc d{N, xs[1], xs[2], xs[3], b->eps, b->momentum, b->fuse, dt, L, options_.dtype, half_y, half_dx};
    if (half_dx) half_grad_[static_cast<size_t>(xv)] = true;
    BatchNormKernel* k = kernels_[static_cast<size_t>(id)].bn = backend_ ? keep(bns_, backend_->make_batch_norm(d)) : nullptr;
    const int r = b->fuse == BnFuse::add_relu ? in(1) : -1;
    if (train) {
      // Batch statistics of one value per channel have no variance (the kernels refuse them at
      // the first step): said now, before a run starts. Synchronised BN counts every rank's.
      RN_CHECK(options_.bn_sync != nullptr || N * xs[2] * xs[3] > 1)
          << "plan: batch norm '" << n.name << "' would train on one value per channel (batch " << N << " x " << xs[2]
          << "x" << xs[3] << " maps): its batch variance is undefined; use a larger batch or larger images";
      if (k != nullptr && options_.bn_sync != nullptr) k->set_stats_reducer(options_.bn_sync);
      const int sm = saved0_[static_cast<size_t>(id)] =
          add_buffer(n.name + ":saved_mean", {xs[1]}, DType::f32, Layout::nchw, BufferRole::saved);
      const int si = saved1_[static_cast<size_t>(id)] =
          add_buffer(n.name + ":saved_invstd", {xs[1]}, DType::f32, Layout::nchw, BufferRole::saved);
      add_recipe(y, Recipe{id, x, r, sm, si, nullptr});
      auto run = [this, k, x, y, r, sm, si, s] {
        Tensor rt = r >= 0 ? view(r) : Tensor{};
        k->forward_training(view(y), view(sm), view(si), view(x), r >= 0 ? &rt : nullptr,
                            model_.compute_param(s.weight), model_.compute_param(s.bias),
                            model_.compute_state(s.running_mean), model_.compute_state(s.running_var));
      };
      if (r >= 0)
        add_step("fwd " + n.name, {x, r}, {y, sm, si}, run);
      else
        add_step("fwd " + n.name, {x}, {y, sm, si}, run);
    } else {
      auto run = [this, k, x, y, r, s] {
        Tensor rt = r >= 0 ? view(r) : Tensor{};
        k->forward_inference(view(y), view(x), r >= 0 ? &rt : nullptr, model_.compute_param(s.weight),
                             model_.compute_param(s.bias), model_.compute_state(s.running_mean),
                             model_.compute_state(s.running_var));
      };
      if (r >= 0)
        add_step("fwd " + n.name, {x, r}, {y}, run);
      else
        add_step("fwd " + n.name, {x}, {y}, run);
    }
  } else if (attrs_if<ReluAttrs>(n)) {
    ReluKernel* k = kernels_[static_cast<size_t>(id)].relu =
        backend_ ? keep(relus_, backend_->make_relu({xs.numel(), dt})) : nullptr;
    add_recipe(y, Recipe{id, x, -1, -1, -1, nullptr});
    add_step("fwd " + n.name, {x}, {y}, [this, k, x, y] { k->forward(view(y), view(x)); });
  } else if (const auto* p = attrs_if<MaxPoolAttrs>(n)) {
    MaxPoolDesc d{N, xs[1], xs[2], xs[3], p->kernel, p->stride, p->pad, dt, L};
    MaxPoolKernel* k = kernels_[static_cast<size_t>(id)].pool = backend_ ? keep(pools_, backend_->make_max_pool(d)) : nullptr;
    // A dry plan does not know the backend's workspace; int32 per output is an upper bound.
    const size_t ws_bytes = k ? k->workspace_bytes() : shape_bytes(d.y_shape(), DType::i32);
    const int ws = saved0_[static_cast<size_t>(id)] =
        add_buffer(n.name + ":workspace", {static_cast<int64_t>(ws_bytes)}, DType::u8, Layout::nchw,
                   BufferRole::saved);
    add_step("fwd " + n.name, {x}, {y, ws}, [this, k, x, y, ws] { k->forward(view(y), view(ws), view(x)); });
  } else if (attrs_if<GlobalAvgPoolAttrs>(n)) {
    GlobalAvgPoolKernel* k = kernels_[static_cast<size_t>(id)].gap =
        backend_ ? keep(gaps_, backend_->make_global_avg_pool({N, xs[1], xs[2], xs[3], dt, L})) : nullptr;
    add_step("fwd " + n.name, {x}, {y}, [this, k, x, y] { k->forward(view(y), view(x)); });
  } else if (const auto* l = attrs_if<LinearAttrs>(n)) {
    LinearDesc d{N, l->in_features, l->out_features, l->bias, dt};
    LinearKernel* k = kernels_[static_cast<size_t>(id)].linear = backend_ ? keep(linears_, backend_->make_linear(d)) : nullptr;
    add_step("fwd " + n.name, {x}, {y}, [this, k, x, y, s] {
      Tensor b = s.bias >= 0 ? model_.compute_param(s.bias) : Tensor{};
      k->forward(view(y), view(x), weight(s.weight), s.bias >= 0 ? &b : nullptr);
    });
  } else {
    RN_FAIL() << "plan: node '" << n.name << "' has a kind the executor does not run";
  }
}

bool Plan::conv_f32_outputs() const {
  return options_.fuse_conv_casts && options_.dtype != DType::f32 && options_.activation_dtype == DType::f32 &&
         backend_ != nullptr && backend_->conv_f32_outputs();
}

bool Plan::bn_half_io() const { return conv_f32_outputs() && backend_->bn_half_io(options_.layout, options_.dtype); }

DType Plan::grad_dtype(int value) const {
  if (half_grad_[static_cast<size_t>(value)]) return options_.dtype;
  return meta_[static_cast<size_t>(act_[static_cast<size_t>(value)])].dtype;
}

DType Plan::node_dtype(int id) const {
  const NodeAttrs& a = model_.graph().node(id).attrs;
  if (std::holds_alternative<ConvAttrs>(a) || std::holds_alternative<LinearAttrs>(a)) return options_.dtype;
  return options_.activation_dtype;
}

const Plan::NodeKernels& Plan::kernels_of(int node) const {
  RN_CHECK(node >= 0 && static_cast<size_t>(node) < kernels_.size()) << "plan: no node " << node;
  return kernels_[static_cast<size_t>(node)];
}

std::optional<DType> Plan::arithmetic(int node) const {
  const NodeKernels& k = kernels_of(node);
  if (k.conv != nullptr) return k.conv->arithmetic();
  if (k.linear != nullptr) return options_.dtype;
  return std::nullopt;
}

std::string Plan::implementation(int node) const {
  const Conv2dKernel* conv = kernels_of(node).conv;
  return conv != nullptr ? conv->implementation() : std::string();
}

CastKernel* Plan::add_cast_step(const std::string& name, int src, int dst) {
  const BufferMeta& from = meta_[static_cast<size_t>(src)];
  CastKernel* cast =
      backend_
          ? keep(casts_, backend_->make_cast({from.shape.numel(), from.dtype, meta_[static_cast<size_t>(dst)].dtype}))
          : nullptr;
  add_step(name, {src}, {dst}, [this, cast, src, dst] { cast->forward(view(dst), view(src)); });
  return cast;
}

int Plan::value_as(int v, DType dtype) {
  const int home = act_[static_cast<size_t>(v)];
  const BufferMeta m = meta_[static_cast<size_t>(home)];
  if (m.dtype == dtype) return home;
  const int64_t key = static_cast<int64_t>(v) * 8 + static_cast<int64_t>(dtype);
  if (auto it = casts_of_.find(key); it != casts_of_.end()) return it->second;
  const std::string name = buffers_[static_cast<size_t>(home)].name + ":" + std::string(dtype_name(dtype));
  const int out = add_buffer(name, m.shape, dtype, m.layout, BufferRole::activation);
  CastKernel* cast = add_cast_step("cast " + name, home, out);
  casts_of_[key] = out;
  add_recipe(out, Recipe{-1, home, -1, -1, -1, cast});
  return out;
}

int Plan::grad_target(int value, DType dtype) {
  int& g = grad_[static_cast<size_t>(value)];
  const BufferMeta m = meta_[static_cast<size_t>(act_[static_cast<size_t>(value)])];
  const std::string name = "d" + model_.graph().node(value).name;
  if (g < 0 && dtype == grad_dtype(value)) {
    g = add_buffer(name, m.shape, dtype, m.layout, BufferRole::gradient);
    return g;
  }
  // A second consumer, or one computing in another dtype: write a partial gradient that
  // finish_contribution() casts and adds in.
  return add_buffer(name + ":partial" + std::to_string(partials_++), m.shape, dtype, m.layout, BufferRole::gradient);
}

int Plan::grad_target_in_place(int value, DType dtype, int reuse) {
  int& g = grad_[static_cast<size_t>(value)];
  const BufferMeta home = meta_[static_cast<size_t>(act_[static_cast<size_t>(value)])];
  const BufferMeta r = meta_[static_cast<size_t>(reuse)];
  const DType gd = grad_dtype(value);
  if (options_.memory == MemoryLevel::O0 || g >= 0 || dtype != gd || r.dtype != gd || r.shape != home.shape ||
      r.layout != home.layout)
    return grad_target(value, dtype);
  g = reuse;
  return g;
}

void Plan::finish_contribution(int value, int target) {
  int& g = grad_[static_cast<size_t>(value)];
  if (target == g) return;
  const BufferMeta home = meta_[static_cast<size_t>(act_[static_cast<size_t>(value)])];
  const BufferMeta part = meta_[static_cast<size_t>(target)];
  const DType gd = grad_dtype(value);
  int src = target;
  if (part.dtype != gd) {
    const std::string name = "d" + model_.graph().node(value).name;
    const bool first = g < 0;
    const int dst = first ? (g = add_buffer(name, home.shape, gd, home.layout, BufferRole::gradient))
                          : add_buffer(name + ":partial" + std::to_string(partials_++), home.shape, gd, home.layout,
                                       BufferRole::gradient);
    add_cast_step("bwd cast " + buffers_[static_cast<size_t>(target)].name, target, dst);
    if (first) return;
    src = dst;
  }
  AddKernel* k = backend_ ? keep(adds_, backend_->make_add({home.shape.numel(), gd})) : nullptr;
  add_step("bwd sum " + buffers_[static_cast<size_t>(g)].name, {g, src}, {g},
           [this, k, g, src] { k->forward(view(g), view(g), view(src)); });
}

void Plan::build_backward() {
  const Graph& g = model_.graph();
  const int out = g.output();
  const int64_t N = options_.batch, K = g.node(out).shape[0];
  const int dlogits = add_buffer("dlogits", {N, K}, DType::f32, Layout::nchw, BufferRole::gradient);
  add_step("bwd loss", {probs_, labels_}, {dlogits},
           [this, dlogits] { loss_kernel_->backward(view(dlogits), view(probs_), view(labels_), loss_scale_); });
  if (grad_dtype(out) == DType::f32) {
    grad_[static_cast<size_t>(out)] = dlogits;
  } else {
    finish_contribution(out, dlogits);  // casts dlogits into the classifier's dtype
  }
  for (int id = out; id >= 1; --id) emit_backward(id);
}

void Plan::emit_backward(int id) {
  const Graph& g = model_.graph();
  const Node& n = g.node(id);
  const int dy = grad_[static_cast<size_t>(id)];
  if (dy < 0) return;  // nothing downstream needs this value
  const Model::NodeSlots s = model_.slots(id);
  const NodeKernels& k = kernels_[static_cast<size_t>(id)];
  const int xv = n.inputs[0];
  const bool need_dx = xv != 0;  // the input batch needs no gradient
  // Forward values read here come from for_backward(), which at O2 first regenerates them.
  const bool reads_x = attrs_if<ConvAttrs>(n) || attrs_if<LinearAttrs>(n) || attrs_if<BatchNormAttrs>(n);
  const bool reads_y = attrs_if<BatchNormAttrs>(n) || (attrs_if<ReluAttrs>(n) && need_dx);
  const int x = reads_x ? for_backward(x_in_[static_cast<size_t>(id)]) : -1;
  const int y = reads_y ? for_backward(act_[static_cast<size_t>(id)]) : -1;
  const DType dt = node_dtype(id);

  if (attrs_if<ConvAttrs>(n)) {
    Conv2dKernel* conv = k.conv;
    const Conv2dDesc& d = conv != nullptr ? conv->desc() : Conv2dDesc{};
    int dy_half = dy;
    if (meta_[static_cast<size_t>(dy)].dtype != dt) {
      // An fp32 output's gradient (O1's fused casts; unless the batch norm after it wrote the
      // gradient in half): the convolution reads it in its dtype.
      const BufferMeta m = meta_[static_cast<size_t>(dy)];
      dy_half = add_buffer(buffers_[static_cast<size_t>(dy)].name + ":" + std::string(dtype_name(dt)), m.shape, dt,
                           m.layout, BufferRole::gradient);
      add_cast_step("bwd cast " + buffers_[static_cast<size_t>(dy)].name, dy, dy_half);
    }
    // Weight gradients first: they are what the all-reduce waits for.
    add_step("bwd_weights " + n.name, {dy_half, x}, {}, [this, conv, dy = dy_half, x, s] {
      Tensor db = s.bias >= 0 ? model_.compute_grad(s.bias) : Tensor{};
      conv->backward_weights(model_.compute_grad(s.weight), s.bias >= 0 ? &db : nullptr, view(dy), view(x));
    });
    mark_finishes(s.weight, s.bias);
    if (need_dx) {
      const int dx = grad_target(xv, conv != nullptr ? d.dx_dtype() : dt);
      add_step("bwd_data " + n.name, {dy_half}, {dx},
               [this, conv, dx, dy = dy_half, s] { conv->backward_data(view(dx), view(dy), weight(s.weight)); });
      finish_contribution(xv, dx);
    }
  } else if (attrs_if<LinearAttrs>(n)) {
    LinearKernel* lin = k.linear;
    add_step("bwd_weights " + n.name, {dy, x}, {}, [this, lin, dy, x, s] {
      Tensor db = s.bias >= 0 ? model_.compute_grad(s.bias) : Tensor{};
      lin->backward_weights(model_.compute_grad(s.weight), s.bias >= 0 ? &db : nullptr, view(dy), view(x));
    });
    mark_finishes(s.weight, s.bias);
    if (need_dx) {
      const int dx = grad_target(xv, dt);
      add_step("bwd_data " + n.name, {dy}, {dx},
               [this, lin, dx, dy, s] { lin->backward_data(view(dx), view(dy), weight(s.weight)); });
      finish_contribution(xv, dx);
    }
  } else if (const auto* b = attrs_if<BatchNormAttrs>(n)) {
    BatchNormKernel* bn = k.bn;
    const int sm = saved0_[static_cast<size_t>(id)], si = saved1_[static_cast<size_t>(id)];
    const int rv = b->fuse == BnFuse::add_relu ? n.inputs[1] : -1;
    RN_CHECK(rv != xv) << "plan: batch_norm '" << n.name << "' uses one value as input and residual";
    // dx overwrites dy in place (dy has no reader after this step) except at O0, where every
    // gradient keeps its own buffer for inspection.
    const int dx = need_dx ? grad_target_in_place(xv, bn != nullptr ? bn->desc().dx_dtype() : dt, dy) : -1;
    const int dr = rv >= 0 && rv != 0 ? grad_target(rv, dt) : -1;
    RN_CHECK(dx >= 0) << "plan: batch_norm '" << n.name << "' directly on the input is not supported";
    RN_CHECK(rv < 0 || dr >= 0) << "plan: residual of '" << n.name << "' is the input batch";
    auto run = [this, bn, dx, dr, dy, x, y, sm, si, s] {
      Tensor drt = dr >= 0 ? view(dr) : Tensor{};
      bn->backward(view(dx), dr >= 0 ? &drt : nullptr, model_.compute_grad(s.weight), model_.compute_grad(s.bias),
                   view(dy), view(x), view(y), model_.compute_param(s.weight), view(sm), view(si));
    };
    if (dr >= 0)
      add_step("bwd " + n.name, {dy, x, y, sm, si}, {dx, dr}, run);
    else
      add_step("bwd " + n.name, {dy, x, y, sm, si}, {dx}, run);
    mark_finishes(s.weight, s.bias);
    finish_contribution(xv, dx);
    if (dr >= 0) finish_contribution(rv, dr);
  } else if (attrs_if<ReluAttrs>(n)) {
    if (!need_dx) return;
    ReluKernel* relu = k.relu;
    const int dx = grad_target(xv, dt);
    add_step("bwd " + n.name, {dy, y}, {dx}, [this, relu, dx, dy, y] { relu->backward(view(dx), view(dy), view(y)); });
    finish_contribution(xv, dx);
  } else if (attrs_if<MaxPoolAttrs>(n)) {
    if (!need_dx) return;
    MaxPoolKernel* pool = k.pool;
    const int ws = saved0_[static_cast<size_t>(id)];
    const int dx = grad_target(xv, dt);
    add_step("bwd " + n.name, {dy, ws}, {dx}, [this, pool, dx, dy, ws] { pool->backward(view(dx), view(dy), view(ws)); });
    finish_contribution(xv, dx);
  } else if (attrs_if<GlobalAvgPoolAttrs>(n)) {
    if (!need_dx) return;
    GlobalAvgPoolKernel* gap = k.gap;
    const int dx = grad_target(xv, dt);
    add_step("bwd " + n.name, {dy}, {dx}, [this, gap, dx, dy] { gap->backward(view(dx), view(dy)); });
    finish_contribution(xv, dx);
  } else {
    RN_FAIL() << "plan: no backward for node '" << n.name << "'";
  }
}

void Plan::add_recipe(int b, const Recipe& r) {
  auto depth_of = [&](int v) {
    auto it = chain_depth_.find(v);
    return v < 0 || it == chain_depth_.end() ? 0 : it->second;
  };
  const int depth = 1 + std::max(depth_of(r.src), depth_of(r.residual));
  if (depth > kMaxRecomputeChain) return;  // kept: it ends the chains of the values computed from it
  recipes_[b] = r;
  chain_depth_[b] = depth;
}

int Plan::for_backward(int b) {
  if (options_.memory != MemoryLevel::O2) return b;
  if (auto it = recomputed_.find(b); it != recomputed_.end()) return it->second;
  const auto rit = recipes_.find(b);
  if (rit == recipes_.end()) return b;  // kept: a convolution, pooling or linear output, the input
  const Recipe rc = rit->second;
  // Inputs first: a block's output needs the previous block's output, regenerated too.
  const int src = for_backward(rc.src);
  const int res = rc.residual >= 0 ? for_backward(rc.residual) : -1;
  const BufferMeta m = meta_[static_cast<size_t>(b)];
  const std::string name = buffers_[static_cast<size_t>(b)].name;
  const int out = add_buffer(name + ":recomputed", m.shape, m.dtype, m.layout, m.role);
  // (In a dry plan the kernels are null; its steps never run.)
  if (rc.node < 0) {
    CastKernel* cast = rc.cast;
    add_step("recompute " + name, {src}, {out}, [this, cast, src, out] { cast->forward(view(out), view(src)); });
  } else if (attrs_if<BatchNormAttrs>(model_.graph().node(rc.node))) {
    BatchNormKernel* bn = kernels_[static_cast<size_t>(rc.node)].bn;
    const Model::NodeSlots s = model_.slots(rc.node);
    const int sm = rc.saved_mean, si = rc.saved_invstd;
    auto run = [this, bn, out, src, res, sm, si, s] {
      Tensor rt = res >= 0 ? view(res) : Tensor{};
      bn->forward_recompute(view(out), view(src), res >= 0 ? &rt : nullptr, model_.compute_param(s.weight),
                            model_.compute_param(s.bias), view(sm), view(si));
    };
    if (res >= 0)
      add_step("recompute " + name, {src, res, sm, si}, {out}, run);
    else
      add_step("recompute " + name, {src, sm, si}, {out}, run);
  } else {
    ReluKernel* relu = kernels_[static_cast<size_t>(rc.node)].relu;
    add_step("recompute " + name, {src}, {out}, [this, relu, src, out] { relu->forward(view(out), view(src)); });
  }
  recomputed_[b] = out;
  return out;
}

void Plan::run_steps(size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    {
      nvtx::Scope range(steps_[i].name.c_str());  // the step by name on a profiler's timeline (core/nvtx.h)
      if (!profiling_) {
        steps_[i].run();
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        steps_[i].run();
        backend_->synchronize();
        step_seconds_[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (grad_ready_ && !steps_[i].finishes.empty()) grad_ready_(steps_[i].finishes);
    if (step_check_) step_check_(steps_[i].name);
  }
}

void Plan::set_profiling(bool on) {
  profiling_ = on;
  step_seconds_.assign(steps_.size(), 0.0);
}

void Plan::forward() {
  RN_CHECK(backend_) << "plan: a dry plan (no backend) cannot run";
  run_steps(0, static_cast<size_t>(forward_steps_));
}

void Plan::backward(float loss_scale) {
  RN_CHECK(backend_) << "plan: a dry plan (no backend) cannot run";
  RN_CHECK(options_.mode == PlanMode::train) << "plan: backward() on an evaluation plan";
  loss_scale_ = loss_scale;
  run_steps(static_cast<size_t>(forward_steps_), steps_.size());
}

Tensor Plan::half_weights() const {
  if (options_.dtype == DType::f32 || !half_weights_.data()) return {};
  Tensor t{half_weights_.data(), {model_.params().total}, options_.dtype};
  t.device = half_weights_.device();
  return t;
}

void Plan::set_loss_scale_source(const Tensor* source) {
  RN_CHECK(loss_kernel_) << "plan: a dry plan has no loss kernel";
  loss_kernel_->set_scale_source(source);
}

Tensor Plan::input() const { return view(input_); }
Tensor Plan::labels() const { return view(labels_); }
Tensor Plan::logits() const { return view(logits_); }
Tensor Plan::probs() const { return view(probs_); }

float Plan::loss() const {
  float v = 0.0f;
  copy_to_host(&v, view(loss_));
  return v;
}

Tensor Plan::loss_tensor() const { return view(loss_); }

void Plan::copy_from_host(const Tensor& dst, const void* host) const {
  RN_CHECK(backend_) << "plan: a dry plan has no memory";
  backend_->memory().copy(dst.data, host, dst.bytes());
}

void Plan::copy_from_host_async(const Tensor& dst, const void* host) const {
  RN_CHECK(backend_) << "plan: a dry plan has no memory";
  backend_->memory().copy_to_device_async(dst.data, host, dst.bytes());
}

void Plan::copy_to_host(void* host, const Tensor& src) const {
  RN_CHECK(backend_) << "plan: a dry plan has no memory";
  backend_->memory().copy(host, src.data, src.bytes());
}

Tensor Plan::activation(int node) const { return view(act_.at(static_cast<size_t>(node))); }

Tensor Plan::activation_grad(int node) const {
  const int g = grad_.at(static_cast<size_t>(node));
  RN_CHECK(g >= 0) << "plan: node " << node << " has no gradient buffer";
  return view(g);
}

MemoryReport Plan::memory() const {
  MemoryReport r;
  r.arena_bytes = arena_bytes_;
  r.buffers = static_cast<int>(buffers_.size());
  r.recomputed_buffers = static_cast<int>(recomputed_.size());
  for (size_t i = 0; i < buffers_.size(); ++i) r.by_role[static_cast<int>(meta_[i].role)] += buffers_[i].bytes;
  // Live bytes per step (a buffer is live from its first write to its last read; persistent
  // ones always), by a difference array over steps.
  const int steps = num_steps();
  std::vector<std::array<int64_t, 4>> delta(static_cast<size_t>(steps) + 1, std::array<int64_t, 4>{});
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const BufferSpec& b = buffers_[i];
    const int first = b.persistent ? 0 : b.first, last = b.persistent ? steps - 1 : std::max(b.first, b.last);
    if (first < 0 || last < first) continue;
    const int role = static_cast<int>(meta_[i].role);
    delta[static_cast<size_t>(first)][role] += static_cast<int64_t>(b.bytes);
    delta[static_cast<size_t>(last) + 1][role] -= static_cast<int64_t>(b.bytes);
  }
  std::array<int64_t, 4> live{};
  for (int step = 0; step < steps; ++step) {
    int64_t total = 0;
    for (int role = 0; role < 4; ++role) total += live[role] += delta[static_cast<size_t>(step)][role];
    if (static_cast<size_t>(total) > r.peak_live_bytes) {
      r.peak_live_bytes = static_cast<size_t>(total);
      r.peak_step = step;
      for (int role = 0; role < 4; ++role) r.peak_by_role[role] = static_cast<size_t>(live[role]);
    }
  }
  if (options_.dtype != DType::f32)
    r.half_weight_bytes = static_cast<size_t>(model_.params().total) * dtype_size(options_.dtype);
  if (backend_) r.workspace_bytes = backend_->workspace_bytes();
  return r;
}

PlannedPeak Plan::planned_peak(int optimizer_copies) const {
  const MemoryReport r = memory();
  PlannedPeak p;
  p.arena = r.arena_bytes;
  p.activations = r.peak_by_role[static_cast<int>(BufferRole::io)] +
                  r.peak_by_role[static_cast<int>(BufferRole::activation)] +
                  r.peak_by_role[static_cast<int>(BufferRole::saved)];
  p.gradients = r.peak_by_role[static_cast<int>(BufferRole::gradient)];
  const size_t flat = static_cast<size_t>(model_.params().total) * sizeof(float);
  p.parameters = flat;
  p.parameter_grads = flat;
  p.optimizer_state = flat * static_cast<size_t>(std::max(0, optimizer_copies));
  p.half_weights = r.half_weight_bytes;
  p.workspace = r.workspace_bytes;
  return p;
}

RangeResidency Plan::arena_residency() const {
  if (arena_.device() != Device::cpu) return {};  // device memory: not measurable by page residency
  return resident_range(arena_.base(), arena_.bytes());
}

std::vector<std::string> Plan::step_names() const {
  std::vector<std::string> names;
  for (const auto& s : steps_) names.push_back(s.name);
  return names;
}

}  // namespace rn

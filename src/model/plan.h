// An executable plan: a model set up for one backend, batch size, dtype, layout, mode
// and memory level. Construction creates every kernel (oneDNN primitive, ...) and
// assigns every activation, saved tensor and gradient an offset in one arena; running
// the plan allocates nothing.
//
// Training step:  plan.input() / plan.labels() filled by the caller;
//                 model.zero_grads(); plan.forward(); plan.backward(loss_scale);
// Parameter gradients (fp32, in the model's flat gradient buffer) accumulate; with a
// loss scale s they hold s * dL/dw.
//
// Memory levels (memory_planner.h): O0 gives every buffer its own memory; O1 shares memory
// between buffers that are never live at once; O2 also stops keeping what is cheap to
// recompute. At O2 the outputs of batch norm (with its fused ReLU / add+ReLU), of ReLU and
// of casts live only until their last forward reader; backward regenerates each, just
// before its first backward reader, from what is kept (convolution outputs, BN saved
// statistics, pooling outputs) with BatchNormKernel::forward_recompute, ReLU or the cast,
// recursively (a block's output needs the previous block's output as its residual; every
// seventh block output in a chain is kept, see kMaxRecomputeChain). The recomputed values
// are bit-identical, so gradients at O2 equal those at O0 and O1.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/memory_planner.h"
#include "model/memory_usage.h"
#include "model/model.h"
#include "ops/backend.h"

namespace rn {

enum class PlanMode : uint8_t { train, eval };

struct PlanOptions {
  int64_t batch = 1;
  DType dtype = DType::f32;             // convolutions and linear layers (and their weights)
  DType activation_dtype = DType::f32;  // the input batch, BN, ReLU and pooling outputs
  // BN parameters and statistics, the loss and all parameter gradients are always fp32.
  // Where a node reads a value of another dtype the plan inserts a cast (precision O1).
  Layout layout = Layout::nhwc;
  PlanMode mode = PlanMode::train;
  MemoryLevel memory = MemoryLevel::O1;
  float label_smoothing = 0.0f;
  // Synchronised batch norm for data-parallel training: every BN kernel of a training plan
  // sums its batch statistics over the ranks with this reducer (not owned; it must outlive
  // the plan). Each rank's plan then calls it twice per BN per step (forward, backward), in
  // the same order on every rank; O2's recompute never calls it. Ignored in eval mode,
  // which uses the running statistics. nullptr: per-rank statistics.
  BatchStatsReducer* bn_sync = nullptr;
  // false: the kernels (so the backend's workspace is known) and the memory plan only, no
  // arena and no device copy of the model: what `resnet info` reports, for a batch that need not
  // fit this machine. Such a plan cannot run.
  bool allocate = true;
  // Precision O1 (half convolutions among fp32 activations): where the backend can
  // (Backend::conv_f32_outputs()), convolutions write their output, and their input gradient
  // where the input is fp32, in fp32 themselves instead of the plan casting them after (those
  // values skip a rounding to the half type); and where it can (Backend::bn_half_io()), batch
  // norms write the half copies the convolutions read: their output where one convolution
  // alone reads it, and the gradient of the convolution before them. Of the twelve casts
  // around a ResNet bottleneck's three convolutions one is left: the block input's (the
  // residual reads it in fp32, or, in a stage's first block, two convolutions read it, whose
  // gradients are summed in fp32). false: plain casts.
  bool fuse_conv_casts = true;
};

enum class BufferRole : uint8_t { io, activation, saved, gradient };

struct MemoryReport {
  size_t arena_bytes = 0;    // planned peak of the arena
  size_t by_role[4] = {};    // sum of buffer sizes per BufferRole (without reuse)
  // The step at which the most arena bytes are live, and the live bytes per role there:
  // the planned peak of activations (io + activation + saved) and of gradients.
  int peak_step = -1;
  size_t peak_live_bytes = 0;
  size_t peak_by_role[4] = {};
  int recomputed_buffers = 0;    // O2: buffers that backward regenerates
  size_t half_weight_bytes = 0;  // the half-precision copy of the weights (dtype != fp32)
  size_t workspace_bytes = 0;    // the backend's shared kernel scratch (0 for a dry plan)
  int buffers = 0;
};

// A plan's planned training memory: the arena (split at its peak step into activations,
// counting the input batch and saved statistics, and activation gradients) plus the
// model's flat fp32 buffers (parameters, their gradients, `optimizer_copies` optimizer
// states of the same size: 1 for momentum SGD and LARS), the half weight copy and the
// backend's workspace.
struct PlannedPeak {
  size_t arena = 0, activations = 0, gradients = 0;
  size_t parameters = 0, parameter_grads = 0, optimizer_state = 0, half_weights = 0, workspace = 0;
  size_t total() const { return arena + parameters + parameter_grads + optimizer_state + half_weights + workspace; }
};

class Plan {
 public:
  // backend == nullptr makes a dry plan: buffers and memory only, nothing runs.
  Plan(Model& model, Backend* backend, const PlanOptions& options);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const PlanOptions& options() const { return options_; }
  Model& model() const { return model_; }

  Tensor input() const;   // [N, C, H, W] in options().activation_dtype and layout
  Tensor labels() const;  // int32 [N]
  Tensor logits() const;  // fp32 [N, K], valid after forward()
  Tensor probs() const;   // fp32 [N, K] softmax, valid after forward()
  float loss() const;     // mean loss of the batch, valid after forward()
  Tensor loss_tensor() const;  // where forward() leaves it: fp32 [1] in the plan's memory
  // Copies between host memory and a tensor of this plan (input, labels, logits, probs),
  // wherever the backend keeps it.
  void copy_from_host(const Tensor& dst, const void* host) const;
  void copy_to_host(void* host, const Tensor& src) const;
  // copy_from_host without waiting (MemorySpace::copy_to_device_async).
  void copy_from_host_async(const Tensor& dst, const void* host) const;
  Backend* backend() const { return backend_; }
  // The half-precision copy of the weights (empty when options().dtype is fp32).
  Tensor half_weights() const;
  // The loss reads its gradient scale from this fp32 [1] tensor (the device loss scale);
  // nullptr: only backward()'s argument.
  void set_loss_scale_source(const Tensor* source);

  void forward();
  void backward(float loss_scale = 1.0f);

  // Gradient of the input batch is never computed. Activations and their gradients are
  // available for tests: the buffers of node `id`'s output and of its gradient (valid
  // right after forward() / backward() only at MemoryLevel::O0, where nothing is reused).
  Tensor activation(int node) const;
  Tensor activation_grad(int node) const;

  MemoryReport memory() const;
  PlannedPeak planned_peak(int optimizer_copies = 1) const;
  // What the steps run so far have touched of the arena (its pages are released when the
  // plan is made): the measured high-water mark to hold against arena_bytes.
  RangeResidency arena_residency() const;
  const Arena& arena() const { return arena_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  int num_steps() const { return static_cast<int>(steps_.size()); }
  // The dtype the multiply-adds of conv or linear node `node` run in (Conv2dKernel::
  // arithmetic(): fp32 where the backend widens half tensors); nullopt for other nodes and in
  // a dry plan.
  std::optional<DType> arithmetic(int node) const;
  // Batch-norm node `node`'s kernel (its descriptor: the dtypes it writes); nullptr for other
  // nodes and in a dry plan.
  const BatchNormKernel* batch_norm(int node) const { return kernels_of(node).bn; }
  // The library's name for conv node `node`'s forward algorithm (Conv2dKernel::
  // implementation(): "jit_wino_4x3:avx512_core", ...); "" where none is told.
  std::string implementation(int node) const;
  // Step names in program order ("fwd layer1.0.conv1", "bwd_data fc", ...).
  std::vector<std::string> step_names() const;
  // The arena bytes step `i` reads and writes (its input and output buffers; weights and
  // parameter gradients live outside the arena and are not counted): the per-layer profile's
  // "bytes that must move".
  struct StepBytes {
    size_t read = 0, written = 0;
  };
  StepBytes step_bytes(int i) const;

  // Called after each backward step that finishes parameter gradients, with their indices
  // into model().params().params (gradient-production order). Data-parallel training starts
  // a gradient bucket's all-reduce there, overlapping the rest of backward. Runs on the
  // thread that runs backward(); nullptr: none.
  using GradReadyFn = std::function<void(const std::vector<int>& params)>;
  void set_grad_ready(GradReadyFn fn) { grad_ready_ = std::move(fn); }
  // Called after every step with its name (sink mode's capture checks that the step left the
  // CUDA graph capture valid, so that a step that breaks it is named); nullptr: none.
  using StepCheckFn = std::function<void(const std::string& step)>;
  void set_step_check(StepCheckFn fn) { step_check_ = std::move(fn); }

  // Per-step wall time, accumulated over runs while profiling is on (seconds, program order).
  void set_profiling(bool on);
  const std::vector<double>& step_seconds() const { return step_seconds_; }

 private:
  struct BufferMeta {
    Shape shape;
    DType dtype;
    Layout layout;
    BufferRole role;
  };
  struct Step {
    std::string name;
    std::function<void()> run;
    std::vector<int> finishes;  // parameters whose gradients are final after this step
    std::vector<int> reads, writes;  // buffers
  };
  // Marks the last step added as the one that finishes node slots' weight and bias gradients.
  void mark_finishes(int weight, int bias);
  GradReadyFn grad_ready_;
  StepCheckFn step_check_;

  int add_buffer(const std::string& name, Shape shape, DType dtype, Layout layout, BufferRole role,
                 bool persistent = false);
  void add_step(std::string name, std::initializer_list<int> reads, std::initializer_list<int> writes,
                std::function<void()> run);
  const Tensor& view(int buffer) const { return views_[static_cast<size_t>(buffer)]; }
  Tensor weight(int param_index) const;  // the weight in the compute dtype
  // The buffer holding value `v` in `dtype` for a reader: v's own buffer, or a cast of it
  // (made once per value and dtype).
  int value_as(int v, DType dtype);
  // The buffer a backward step writes its gradient contribution for value `v` into, in the
  // step's `dtype`; finish_contribution() casts and sums it into v's gradient.
  int grad_target(int value, DType dtype);
  void finish_contribution(int value, int target);
  // grad_target(), but where allowed (not O0; v's first contribution; same dtype, shape and
  // layout) the gradient is written in place over `reuse`, a gradient nothing reads later.
  int grad_target_in_place(int value, DType dtype, int reuse);
  DType node_dtype(int id) const;
  // A step `name` casting buffer `src` into `dst` (their dtypes); the kernel (nullptr in a dry plan).
  CastKernel* add_cast_step(const std::string& name, int src, int dst);
  // Whether conv node outputs are fp32 written by the convolution (PlanOptions::fuse_conv_casts).
  bool conv_f32_outputs() const;
  // And whether batch norms write half copies for the convolutions around them (their y for
  // the next, their dx for the one before: BatchNormDesc::half_y, half_dx).
  bool bn_half_io() const;
  // The dtype of value `v`'s gradient: its own, or the half type where the batch norm that
  // alone reads an fp32 convolution output writes that gradient in half (half_dx).
  DType grad_dtype(int value) const;

  // The buffer a backward step reads forward buffer `b` from: `b` itself, or at O2, for a
  // value freed after forward, the buffer it is recomputed into (made on first use).
  int for_backward(int b);

  void build_forward();
  void build_backward();
  void emit_forward(int id);
  void emit_backward(int id);

  Model& model_;
  Backend* backend_;
  PlanOptions options_;
  std::vector<BufferSpec> buffers_;
  std::vector<BufferMeta> meta_;
  std::vector<Tensor> views_;
  std::vector<Step> steps_;
  int forward_steps_ = 0;
  size_t arena_bytes_ = 0;
  Arena arena_;
  DeviceBuffer half_weights_;

  std::vector<int> act_;      // node -> output buffer
  std::vector<int> grad_;     // node -> gradient buffer (final)
  std::vector<bool> half_grad_;            // node -> its gradient is in options_.dtype (grad_dtype())
  std::vector<std::vector<int>> readers_;  // node -> the nodes that read its output (Graph::consumers())
  std::vector<int> saved0_, saved1_;  // node -> BN saved mean/invstd, max-pool workspace
  std::vector<int> x_in_;             // node -> the buffer its first input was read from
  std::unordered_map<int64_t, int> casts_of_;  // value * 8 + dtype -> cast buffer
  // How to regenerate a buffer at O2 from other buffers: BN (kernel bn; src = x, residual,
  // saved statistics), ReLU or cast (src).
  struct Recipe {
    int node = -1;  // BN / ReLU node (its kernel and parameters); -1 for a cast
    int src = -1, residual = -1, saved_mean = -1, saved_invstd = -1;
    CastKernel* cast = nullptr;
  };
  std::unordered_map<int, Recipe> recipes_;  // forward buffer -> recipe
  // Regenerating a block's output regenerates the previous block's first, so a stage's
  // outputs would all be live at once in backward. A value whose chain of recompute steps
  // would exceed kMaxRecomputeChain is kept instead, a checkpoint that ends the chains after
  // it. 6 gives the smallest O2 arena for ResNet-50/101/152 (ResNet-101: 6.7 GiB at batch
  // 100 instead of 8.0 GiB with unbounded chains).
  std::unordered_map<int, int> chain_depth_;  // forward buffer -> recompute steps to regenerate it
  static constexpr int kMaxRecomputeChain = 6;
  void add_recipe(int buffer, const Recipe& recipe);
  std::unordered_map<int, int> recomputed_;  // forward buffer -> recomputed buffer
  int input_ = -1, labels_ = -1, logits_ = -1, probs_ = -1, loss_ = -1;
  float loss_scale_ = 1.0f;
  bool profiling_ = false;
  std::vector<double> step_seconds_;
  void run_steps(size_t begin, size_t end);
  int partials_ = 0;

  // Kernels, created once; owned here, referenced by the steps.
  std::vector<std::unique_ptr<Conv2dKernel>> convs_;
  std::vector<std::unique_ptr<BatchNormKernel>> bns_;
  std::vector<std::unique_ptr<ReluKernel>> relus_;
  std::vector<std::unique_ptr<AddKernel>> adds_;
  std::vector<std::unique_ptr<CastKernel>> casts_;
  std::vector<std::unique_ptr<MaxPoolKernel>> pools_;
  std::vector<std::unique_ptr<GlobalAvgPoolKernel>> gaps_;
  std::vector<std::unique_ptr<LinearKernel>> linears_;
  std::unique_ptr<SoftmaxCrossEntropyKernel> loss_kernel_;
  // The kernel each node's forward and backward steps use (only one member is set).
  struct NodeKernels {
    Conv2dKernel* conv = nullptr;
    BatchNormKernel* bn = nullptr;
    ReluKernel* relu = nullptr;
    MaxPoolKernel* pool = nullptr;
    GlobalAvgPoolKernel* gap = nullptr;
    LinearKernel* linear = nullptr;
  };
  std::vector<NodeKernels> kernels_;
  const NodeKernels& kernels_of(int node) const;  // checked index
};

}  // namespace rn

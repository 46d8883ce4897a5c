// The device training step's own ops: the fused update and CUDA-graph capture.
//
// FusedStepKernel does, per step and entirely on the device (no host synchronisation):
//   1. overflow = any inf/NaN in the flat fp32 gradients (scaled by the loss scale);
//   2. the loss-scale rule (fused::loss_scale_update) on device-resident counters; the
//      device scale tensor, which the loss kernel reads as its scale source, is updated;
//   3. unless overflow: one pass over the flat buffers: g = grad / scale_used, the SGD or
//      LARS update of the fp32 master weights and the momentum, the optional rounding of
//      the master to half (precision O3) and the write of the half copy.
// The per-element arithmetic is ops/fused_math.h, the CPU optimizer's too. The learning
// rate is a launch argument, or (for captured graphs) read from a device table of the
// next steps' rates (set_lr_table), whose index advances every step.
//
// StepGraph captures the work a function queues (a whole training step) once and replays
// it; a backend without graphs refuses with rn::Unsupported.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/fused_math.h"

namespace rn {

enum class FusedOptimizer : uint8_t { sgd, lars };

struct FusedParam {
  int64_t offset = 0, numel = 0;  // in elements of the flat buffers
  float weight_decay = 0.0f;      // 0 where not decayed
  bool lars_adapt = false;
};

struct FusedStepDesc {
  int64_t total = 0;  // elements of the flat buffers
  std::vector<FusedParam> params;
  FusedOptimizer optimizer = FusedOptimizer::sgd;
  bool nesterov = false;
  float momentum = 0.9f;
  double lars_eta = 0.001, lars_eps = 0.0;
  fused::LossScaleRule loss_scale;  // dynamic=false: the scale stays (static or none)
  DType half = DType::f32;          // the half copy written by the pass (f32: none)
  bool round_master_to_half = false;
  void validate() const;
};

class FusedStepKernel {
 public:
  explicit FusedStepKernel(const FusedStepDesc& d) : desc_(d) { desc_.validate(); }
  virtual ~FusedStepKernel() = default;
  const FusedStepDesc& desc() const { return desc_; }

  // fp32 [1] in device memory: the current loss scale (give it to the loss as scale source).
  virtual Tensor loss_scale_tensor() const = 0;
  // weights, grads: fp32 [total]; half_weights: [total] in desc().half, or null when f32.
  // lr < 0: take the next rate of the device table.
  void step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr);
  // Uploads the rates of the next steps (synchronous); the table index restarts at 0.
  virtual void set_lr_table(const std::vector<float>& lrs) = 0;
  // Sink mode's record of the losses: with a source set (fp32 [1] in device memory, where the
  // loss kernel leaves the batch's mean loss), every step that takes its rate from the table
  // also copies the loss into that entry's slot, so the host reads the losses of all the
  // steps between two synchronisations at the second one. Set it before a step is captured.
  void set_loss_source(const Tensor& loss);
  // The recorded losses of the first n entries of the current table (synchronous; n at most
  // the table's size).
  virtual std::vector<float> table_losses(int n) const = 0;

  // Synchronising reads and writes of the device state (for logs and checkpoints).
  virtual fused::LossScaleCounters counters() const = 0;
  // Also empties the record of scale changes (scale_changes()).
  virtual void set_counters(const fused::LossScaleCounters& c) = 0;
  // The scale changes since set_counters (synchronous).
  virtual fused::LossScaleChangeLog scale_changes() const = 0;
  virtual void read_momentum(float* host) const = 0;  // total floats
  virtual void write_momentum(const float* host) = 0;

 protected:
  virtual void do_step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr) = 0;
  FusedStepDesc desc_;
  const float* loss_source_ = nullptr;  // set_loss_source
};

class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs `work` under capture (nothing executes), then instantiates the graph.
  virtual void capture(const std::function<void()>& work) = 0;
  // False before the first capture, and again when the graph went stale (addresses it holds
  // were reallocated, e.g. a shared workspace that grew): the caller then captures again.
  virtual bool captured() const = 0;
  // Queues one replay.
  virtual void replay() = 0;
  // During capture(): throws, naming `after`, when the capture has been invalidated (a call
  // the graph cannot hold was made since the last check), so that the step that broke it is
  // known instead of only the end of the capture failing. Nothing elsewhere.
  virtual void check_capture(const std::string& after) { (void)after; }
  // Drops the capture (captured() is false until the next capture): data-parallel ranks
  // capture again together when one of them must.
  virtual void invalidate() = 0;
};

}  // namespace rn

namespace rn {

// The fused step on the host, in plain loops over the same arithmetic: the reference the
// device kernels follow, and what a test double of a device backend runs. Its loss scale
// tensor lives in host memory.
std::unique_ptr<FusedStepKernel> make_host_fused_step(const FusedStepDesc& d);

}  // namespace rn

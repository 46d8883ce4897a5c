// One training step over a prepared plan: forward, backward with the loss scale, the
// overflow check on all gradients, then the optimizer (one fused pass that also unscales)
// or a skip that leaves weights and optimizer state untouched. Shared by `resnet train`
// and `resnet bench` so that the benchmark times exactly what training runs.
//
// On a host backend the Optimizer and LossScaler objects do the work. On a device backend
// the same arithmetic runs on the device (ops/fused_step.h): the loss scale, its counters
// and the momentum live there, the loss reads the scale from device memory, and a step
// queues work without waiting for it. sync_host_state() brings the device state back into
// the Optimizer, LossScaler and Model (logging every loss-scale change as the host scaler
// does), for logs and checkpoints.
//
// Data-parallel on a device: the gradient buckets' all-reduces are queued on the device
// communicator's stream as backward queues their last kernels, and the fused update is
// queued behind a device-side join of all of them, so the host never waits inside run().
//
// Sink mode (device only, sink_size > 0): the first step runs eagerly, the second is
// captured as one graph (zero gradients, forward, backward, fused update) and every later
// step replays it; the learning rate
// comes from a device table of the next sink_size rates, uploaded every sink_size steps,
// which is the only host synchronisation. Eager and sink modes queue the same kernels in
// the same order, so they give the same results. Each step also records its loss in the
// table's slot, and take_losses() reads those of the steps since the last read, so that the
// host knows every step's loss without reading it at every step.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "dist/grad_buckets.h"
#include "model/plan.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace rn {

class TrainStep {
 public:
  TrainStep(Plan& plan, Optimizer& optimizer, LossScaler& scaler, const PrecisionPolicy& policy, int sink_size = 0);
  ~TrainStep();

  // The caller has filled plan.input() and plan.labels(). Returns true when the update was
  // applied, false when the step was skipped for an inf/NaN gradient; on a device the
  // verdict is known only after sync_host_state(), and run() returns true.
  bool run(double lr);
  // Sink mode: the rate of global step s (the table is filled from it); run()'s lr is ignored.
  void set_lr_source(std::function<double(int64_t)> lr_at, int64_t first_step);
  // Sink mode: the losses of the steps run since the last call, in order; a synchronisation
  // (it waits for those steps, as a read of the loss does). Empty outside sink mode.
  std::vector<float> take_losses();

  bool on_device() const { return fused_ != nullptr; }
  int sink_size() const { return sink_size_; }
  void sync_host_state();
  // The loss scaler's state alone (a few bytes, for the log line), logging a changed scale.
  void sync_scaler_state();

  Plan& plan() { return plan_; }

  // Data-parallel training: backward hands each finished gradient to `reducer`, whose bucket
  // all-reduces (average) overlap the rest of backward; the overflow check and the optimizer
  // then see the averaged gradients, the same on every rank. nullptr: one rank.
  // On a device the reducer must work on the device gradients with a device communicator
  // (train/data_parallel.h); the step joins the buckets (GradientReducer::finish_on_device)
  // so that the update waits for them on the device and run() still returns without
  // waiting. In sink mode the communicator must be capturable (NCCL): the all-reduces are
  // captured in the step graph, the ranks capture it again together, and the host waits for
  // the replays at sync points; otherwise the reducer is refused.
  void set_gradient_reducer(GradientReducer* reducer);
  // The last step's communication (zero without a reducer). On a device its seconds arrive
  // with wait_for_gradients() (CUDA events on the communicator's stream); untimed before.
  const CommStats& last_comm() const { return comm_; }
  // Device path with a reducer: blocks until the last step's all-reduces are done, under the
  // communicator's timeout. Call it before a synchronisation that would otherwise wait
  // without a limit (reading the loss); a no-op elsewhere.
  void wait_for_gradients();

 private:
  void queue_device_step(float lr);
  // Sink mode: moves the current table's recorded losses not yet read into untaken_.
  void harvest_losses();

  Plan& plan_;
  Optimizer& optimizer_;
  LossScaler& scaler_;
  PrecisionPolicy policy_;
  int sink_size_ = 0;
  std::unique_ptr<FusedStepKernel> fused_;
  std::unique_ptr<StepGraph> graph_;
  std::function<double(int64_t)> lr_at_;
  int64_t next_step_ = 0;  // sink mode: global step of the next run()
  int64_t window_end_ = -1;
  int64_t window_start_ = 0;  // the step of the table's first entry
  int64_t losses_read_ = 0;   // entries of the table already moved to untaken_
  std::vector<float> untaken_;
  bool warmed_up_ = false;
  int captures_ = 0;
  int64_t scale_changes_logged_ = 0;  // of the device's record (fused::LossScaleChangeLog)
  GradientReducer* reducer_ = nullptr;
  CommStats comm_;
};

// Rounds every master weight to the nearest `half` value (precision O3).
void round_weights_to(float* weights, int64_t n, DType half);

// The device step's description from the host optimizer's configuration and parameters.
FusedStepDesc fused_step_desc(const OptimizerConfig& cfg, const ParamTable& table, const LossScaler& scaler,
                              const PrecisionPolicy& policy);

}  // namespace rn

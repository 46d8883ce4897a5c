#include "train/train_step.h"

#include <algorithm>
#include <utility>

#include "core/log.h"
#include "core/plural.h"
#include "core/thread_pool.h"
#include "dist/activity.h"

namespace rn {

FusedStepDesc fused_step_desc(const OptimizerConfig& cfg, const ParamTable& table, const LossScaler& scaler,
                              const PrecisionPolicy& policy) {
  FusedStepDesc d;
  d.total = table.total;
  for (const ParamView& p : table.params)
    d.params.push_back({p.offset, p.numel, p.weight_decay ? static_cast<float>(cfg.weight_decay) : 0.0f, p.lars_adapt});
  d.optimizer = cfg.name == OptimizerKind::lars ? FusedOptimizer::lars : FusedOptimizer::sgd;
  d.nesterov = cfg.nesterov;
  d.momentum = static_cast<float>(cfg.momentum);
  d.lars_eta = cfg.lars_eta;
  d.lars_eps = cfg.lars_eps;
  d.loss_scale = scaler.rule();
  d.half = policy.conv_dtype;
  d.round_master_to_half = policy.round_master_to_half;
  return d;
}

TrainStep::TrainStep(Plan& plan, Optimizer& optimizer, LossScaler& scaler, const PrecisionPolicy& policy, int sink_size)
    : plan_(plan), optimizer_(optimizer), scaler_(scaler), policy_(policy), sink_size_(sink_size) {
  RN_CHECK(sink_size >= 0) << "sink_size " << sink_size << " is negative";
  Backend* backend = plan.backend();
  if (backend == nullptr || backend->device() == Device::cpu) {
    RN_CHECK(sink_size == 0) << "sink mode (sink_size " << sink_size << ") needs a device backend; "
                             << (backend ? backend->name() : "a dry plan") << " runs on the host";
    return;
  }
  RN_CHECK(sink_size == 0 || plan.options().memory != MemoryLevel::O2)
      << "sink mode cannot capture memory level O2 (its recompute checks synchronise); use O1";
  fused_ = backend->make_fused_step(fused_step_desc(optimizer.config(), optimizer.params(), scaler, policy));
  // The host objects' state (a fresh start or a resumed checkpoint) moves to the device.
  const LossScaler::State& s = scaler.state();
  fused_->set_counters({s.scale, s.step, s.clean_steps, s.skipped_steps, s.consecutive_skips});
  fused_->write_momentum(optimizer.state().data());
  const Tensor scale = fused_->loss_scale_tensor();
  plan.set_loss_scale_source(&scale);
  if (sink_size > 0) {
    graph_ = backend->make_step_graph();
    fused_->set_loss_source(plan.loss_tensor());
  }
}

TrainStep::~TrainStep() {
  if (fused_) plan_.set_loss_scale_source(nullptr);
}

void TrainStep::set_lr_source(std::function<double(int64_t)> lr_at, int64_t first_step) {
  harvest_losses();  // a table that ends here keeps its losses for take_losses()
  lr_at_ = std::move(lr_at);
  next_step_ = first_step;
  window_end_ = -1;
}

void TrainStep::harvest_losses() {
  if (!fused_ || sink_size_ == 0 || window_end_ < 0) return;
  const int64_t run_so_far = std::min(next_step_, window_end_) - window_start_;
  if (run_so_far <= losses_read_) return;
  const std::vector<float> all = fused_->table_losses(static_cast<int>(run_so_far));
  untaken_.insert(untaken_.end(), all.begin() + losses_read_, all.end());
  losses_read_ = run_so_far;
}

std::vector<float> TrainStep::take_losses() {
  if (!fused_ || sink_size_ == 0) return {};
  wait_for_gradients();  // the read below synchronises
  harvest_losses();
  return std::exchange(untaken_, {});
}

void TrainStep::queue_device_step(float lr) {
  Model& model = plan_.model();
  set_activity("queueing the step on the device");
  model.zero_grads();
  plan_.forward();
  if (reducer_) reducer_->begin_step();
  plan_.backward(1.0f);  // the device loss scale multiplies this
  // The overflow check and the optimizer below read the averaged gradients: the compute
  // stream waits for every bucket there, the host does not.
  if (reducer_) comm_ = reducer_->finish_on_device();
  const int64_t n = model.params().total;
  Tensor w{model.compute_param_data(), {n}, DType::f32};
  Tensor g{model.compute_grad_data(), {n}, DType::f32};
  w.device = g.device = model.compute_device();
  const Tensor half = plan_.half_weights();
  fused_->step(w, g, half.data ? &half : nullptr, lr);
}

void TrainStep::set_gradient_reducer(GradientReducer* reducer) {
  RN_CHECK(reducer == nullptr || sink_size_ == 0 || reducer->capturable())
      << "sink mode (run.sink_size " << sink_size_ << ") cannot run data-parallel over a communicator whose "
      << "all-reduces a CUDA graph cannot hold; use run.sink_size=0 with more than one rank";
  if (reducer_ && reducer_ != reducer) reducer_->wait_joined();
  // A captured step holds the old reducer's collectives (or none): capture it again.
  if (graph_ && reducer != reducer_ && graph_->captured()) graph_->invalidate();
  reducer_ = reducer;
  if (reducer)
    plan_.set_grad_ready([reducer](const std::vector<int>& params) { reducer->on_ready(params); });
  else
    plan_.set_grad_ready(nullptr);
}

bool TrainStep::run(double lr) {
  Model& model = plan_.model();
  if (fused_ && sink_size_ == 0) {
    queue_device_step(static_cast<float>(lr));
    return true;
  }
  if (fused_) {
    RN_CHECK(lr_at_) << "sink mode: set_lr_source() first";
    if (next_step_ >= window_end_) {  // a new window: the only synchronisation
      harvest_losses();  // the ending table's losses, before the new one replaces them
      std::vector<float> table(static_cast<size_t>(sink_size_));
      for (int i = 0; i < sink_size_; ++i) table[static_cast<size_t>(i)] = static_cast<float>(lr_at_(next_step_ + i));
      fused_->set_lr_table(table);
      window_start_ = next_step_;
      window_end_ = next_step_ + sink_size_;
      losses_read_ = 0;
    }
    if (!warmed_up_) {
      // The first step runs eagerly (libraries finish their lazy set-up outside the
      // capture), taking its rate from the table like every replay.
      queue_device_step(-1.0f);
      warmed_up_ = true;
    } else {
      bool stale = !graph_->captured();
      // Capturing collectives is itself collective: when one rank's graph went stale (its
      // workspace grew), every rank captures again, so that the NCCL calls match.
      if (reducer_) stale = reducer_->any_rank(stale);
      if (stale) {
        if (captures_ > 0)
          RN_LOG_INFO("sink mode: the step graph is stale (the device workspace was reallocated for new kernels{}); "
                      "capturing it again",
                      reducer_ ? ", on this rank or another" : "");
        // The eager warm-up's (or the old graph's) collectives are waited for under the
        // timeout and outside the capture: no event may be polled while the stream is captured.
        if (reducer_) reducer_->wait_device();
        if (graph_->captured()) graph_->invalidate();  // another rank's graph went stale
        graph_->capture([this] {
          // Each plan step is checked as it is queued, so that one that breaks the capture is named.
          plan_.set_step_check([this](const std::string& step) { graph_->check_capture(step); });
          struct Reset {
            Plan& plan;
            ~Reset() { plan.set_step_check(nullptr); }
          } reset{plan_};
          queue_device_step(-1.0f);
          graph_->check_capture("the gradient all-reduce and the fused optimizer step");
        });
        ++captures_;
      }
      graph_->replay();
    }
    ++next_step_;
    return true;
  }
  model.zero_grads();
  set_activity("forward");
  plan_.forward();
  const float scale = scaler_.scale();
  set_activity("backward");
  if (reducer_) reducer_->begin_step();
  plan_.backward(scale);
  if (reducer_) {
    set_activity("waiting for the gradient all-reduce");
    comm_ = reducer_->finish();
  }
  set_activity("optimizer");
  const int64_t n = model.params().total;
  const bool overflow = scaler_.check_overflow(model.grad_data(), n);
  const float inv_scale = scaler_.inv_scale();  // read before update() may change it
  if (!scaler_.update(overflow)) return false;
  optimizer_.step(model.param_data(), model.grad_data(), lr, inv_scale);
  if (policy_.round_master_to_half) round_weights_to(model.param_data(), n, policy_.half);
  return true;
}

void TrainStep::wait_for_gradients() {
  if (fused_ && reducer_) {
    set_activity("waiting for the gradient all-reduce");
    if (sink_size_ > 0) {
      // Replays hold the all-reduces: wait for the replays queued so far, under the timeout.
      reducer_->wait_device();
      return;
    }
    if (auto s = reducer_->wait_joined()) comm_ = std::move(*s);  // now with the device's times
  }
}

void TrainStep::sync_host_state() {
  if (!fused_) return;
  sync_scaler_state();
  std::vector<float> momentum(static_cast<size_t>(plan_.model().params().total));
  fused_->read_momentum(momentum.data());
  optimizer_.set_state(momentum);
  plan_.model().to_host();
}

void TrainStep::sync_scaler_state() {
  if (!fused_) return;
  wait_for_gradients();  // the reads below synchronise
  const fused::LossScaleCounters c = fused_->counters();
  LossScaler::State s;
  s.scale = c.scale;
  s.step = c.step;
  s.clean_steps = c.clean_steps;
  s.skipped_steps = c.skipped_steps;
  s.consecutive_skips = c.consecutive_skips;
  // Each change the device made since the last read, with its own step (the host reads at
  // log lines and sink windows only, and would otherwise see several changes as one).
  const fused::LossScaleChangeLog log = fused_->scale_changes();
  const int64_t kept = std::max(scale_changes_logged_, log.count - fused::kScaleChangeLog);
  if (kept > scale_changes_logged_)
    RN_LOG_WARN(
        "loss scale: {} between two reads of the device's record, which keeps the last {}; the first {} "
        "are not logged",
        counted(log.count - scale_changes_logged_, "change"), fused::kScaleChangeLog, kept - scale_changes_logged_);
  for (int64_t i = kept; i < log.count; ++i)
    RN_LOG_INFO("{}", LossScaler::change_text(log.entries[i % fused::kScaleChangeLog]));
  scale_changes_logged_ = log.count;
  const int64_t new_skips = s.skipped_steps - scaler_.state().skipped_steps;
  scaler_.set_state_quietly(s);
  // The host's update() warns at each such skip; the device's are seen here, together.
  if (const std::string why = scaler_.skip_reason(); new_skips > 0 && !why.empty())
    RN_LOG_WARN("{} skipped by step {}: inf/NaN gradients ({}; {} in a row)",
                counted(new_skips, "step was", "steps were"), s.step, why, s.consecutive_skips);
}

void round_weights_to(float* w, int64_t n, DType half) {
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] = round_to_dtype(w[i], half);
  });
}

}  // namespace rn

#include "train/train_step.h"

#include "core/thread_pool.h"
#include "dist/activity.h"

namespace rn {

TrainStep::TrainStep(Plan& plan, Optimizer& optimizer, LossScaler& scaler, const PrecisionPolicy& policy)
    : plan_(plan), optimizer_(optimizer), scaler_(scaler), policy_(policy) {}

void TrainStep::set_gradient_reducer(GradientReducer* reducer) {
  reducer_ = reducer;
  if (reducer)
    plan_.set_grad_ready([reducer](const std::vector<int>& params) { reducer->on_ready(params); });
  else
    plan_.set_grad_ready(nullptr);
}

bool TrainStep::run(double lr) {
  Model& model = plan_.model();
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

void round_weights_to(float* w, int64_t n, DType half) {
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] = round_to_dtype(w[i], half);
  });
}

}  // namespace rn

#include "ops/fused_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/check_tensor.h"

namespace rn {

void FusedStepDesc::validate() const {
  RN_CHECK(total > 0) << "fused step: empty parameter buffer";
  RN_CHECK(momentum >= 0.0f) << "fused step: momentum " << momentum;
  RN_CHECK(half == DType::f32 || half == DType::f16 || half == DType::bf16)
      << "fused step: half copy in " << dtype_name(half);
  for (const FusedParam& p : params)
    RN_CHECK(p.offset >= 0 && p.numel >= 0 && p.offset + p.numel <= total)
        << "fused step: parameter [" << p.offset << ", " << p.offset + p.numel << ") outside the buffer of " << total;
  RN_CHECK(!loss_scale.dynamic || (loss_scale.backoff > 0 && loss_scale.backoff < 1 && loss_scale.growth >= 1 &&
                                   loss_scale.growth_interval >= 1))
      << "fused step: bad dynamic loss-scale rule";
}

void FusedStepKernel::set_loss_source(const Tensor& loss) {
  check_tensor(loss, {1}, DType::f32, "loss", "fused step");
  loss_source_ = loss.ptr<float>();
}

void FusedStepKernel::step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr) {
  const std::string op = "fused step";
  check_tensor(weights, {desc_.total}, DType::f32, "weights", op);
  check_tensor(grads, {desc_.total}, DType::f32, "grads", op);
  RN_CHECK((half_weights != nullptr) == (desc_.half != DType::f32)) << op << ": half copy given iff half != f32";
  if (half_weights) check_tensor(*half_weights, {desc_.total}, desc_.half, "half_weights", op);
  do_step(weights, grads, half_weights, lr);
}

}  // namespace rn

namespace rn {
namespace {

class HostFusedStep final : public FusedStepKernel {
 public:
  explicit HostFusedStep(const FusedStepDesc& d)
      : FusedStepKernel(d), momentum_(static_cast<size_t>(d.total), 0.0f), trust_(d.params.size(), 1.0) {}

  Tensor loss_scale_tensor() const override {
    Tensor t;
    t.data = const_cast<float*>(&loss_scale_);
    t.shape = {1};
    t.dtype = DType::f32;
    return t;
  }
  void set_lr_table(const std::vector<float>& lrs) override {
    RN_CHECK(!lrs.empty()) << "fused step: empty learning-rate table";
    lr_table_ = lrs;
    lr_index_ = 0;
    losses_.assign(lrs.size(), 0.0f);
  }
  std::vector<float> table_losses(int n) const override {
    RN_CHECK(n >= 0 && static_cast<size_t>(n) <= losses_.size())
        << "fused step: losses of " << n << " steps asked, the table holds " << losses_.size();
    return std::vector<float>(losses_.begin(), losses_.begin() + n);
  }
  fused::LossScaleCounters counters() const override { return counters_; }
  void set_counters(const fused::LossScaleCounters& c) override {
    counters_ = c;
    loss_scale_ = static_cast<float>(c.scale);
    changes_ = {};
  }
  fused::LossScaleChangeLog scale_changes() const override { return changes_; }
  void read_momentum(float* host) const override { std::copy(momentum_.begin(), momentum_.end(), host); }
  void write_momentum(const float* host) override { std::copy(host, host + desc_.total, momentum_.begin()); }

 protected:
  void do_step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr) override {
    float* w = weights.ptr<float>();
    const float* g = grads.ptr<float>();
    bool overflow = false;
    for (int64_t i = 0; i < desc_.total; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &g[i], 4);
      overflow = overflow || fused::is_inf_or_nan_bits(bits);
    }
    const float m = static_cast<float>(1.0 / counters_.scale);
    const fused::LossScaleCounters before = counters_;
    const bool applied = fused::loss_scale_update(counters_, desc_.loss_scale, overflow);
    fused::record_scale_change(changes_, before, counters_, overflow);
    loss_scale_ = static_cast<float>(counters_.scale);
    if (lr < 0.0f) {
      RN_CHECK(!lr_table_.empty()) << "fused step: no learning-rate table set";
      const size_t at = std::min(lr_index_++, lr_table_.size() - 1);
      lr = lr_table_[at];
      if (loss_source_) losses_[at] = *loss_source_;
    }
    if (!applied) return;
    const bool lars = desc_.optimizer == FusedOptimizer::lars;
    for (size_t p = 0; p < desc_.params.size(); ++p) {
      const FusedParam& fp = desc_.params[p];
      float step_lr = lr;
      if (lars && fp.lars_adapt) {
        double w2 = 0, g2 = 0;
        for (int64_t i = fp.offset; i < fp.offset + fp.numel; ++i) {
          w2 += static_cast<double>(w[i]) * w[i];
          const double gi = static_cast<double>(g[i]) * m;
          g2 += gi * gi;
        }
        step_lr = static_cast<float>(static_cast<double>(lr) * fused::lars_trust_ratio(std::sqrt(w2), std::sqrt(g2),
                                                                                       fp.weight_decay, desc_.lars_eta,
                                                                                       desc_.lars_eps));
      }
      for (int64_t i = fp.offset; i < fp.offset + fp.numel; ++i) {
        float& buf = momentum_[static_cast<size_t>(i)];
        if (lars)
          fused::lars_update_element(w[i], buf, g[i] * m, fp.weight_decay, step_lr, desc_.momentum, desc_.nesterov);
        else
          fused::sgd_update_element(w[i], buf, g[i] * m, fp.weight_decay, step_lr, desc_.momentum, desc_.nesterov);
        if (desc_.round_master_to_half && desc_.half != DType::f32) w[i] = round_to_dtype(w[i], desc_.half);
      }
    }
    if (half_weights) convert(half_weights->data, desc_.half, w, DType::f32, static_cast<size_t>(desc_.total));
  }

 private:
  std::vector<float> momentum_;
  std::vector<double> trust_;
  fused::LossScaleCounters counters_;
  fused::LossScaleChangeLog changes_;
  float loss_scale_ = 1.0f;
  std::vector<float> lr_table_, losses_;
  size_t lr_index_ = 0;
};

}  // namespace

std::unique_ptr<FusedStepKernel> make_host_fused_step(const FusedStepDesc& d) {
  return std::make_unique<HostFusedStep>(d);
}

}  // namespace rn

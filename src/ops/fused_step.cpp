#include "ops/fused_step.h"

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

void FusedStepKernel::step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr) {
  const std::string op = "fused step";
  check_tensor(weights, {desc_.total}, DType::f32, "weights", op);
  check_tensor(grads, {desc_.total}, DType::f32, "grads", op);
  RN_CHECK((half_weights != nullptr) == (desc_.half != DType::f32)) << op << ": half copy given iff half != f32";
  if (half_weights) check_tensor(*half_weights, {desc_.total}, desc_.half, "half_weights", op);
  do_step(weights, grads, half_weights, lr);
}

}  // namespace rn

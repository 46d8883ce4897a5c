// The CUDA fused training step and step graph (ops/fused_step.h).
#pragma once

#include <memory>

#include "backends/cuda/context.h"
#include "ops/fused_step.h"

namespace rn::cuda {

std::unique_ptr<FusedStepKernel> make_fused_step(const ContextPtr& ctx, const FusedStepDesc& d);

// Stream capture of the step (step_graph.cpp).
std::unique_ptr<StepGraph> make_step_graph(const ContextPtr& ctx);

}  // namespace rn::cuda

// The CUDA fused training step and step graph (ops/fused_step.h).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "backends/cuda/context.h"
#include "core/memory_space.h"
#include "ops/fused_step.h"

namespace rn::cuda {

// The fused step's kernels (fused_step.cu) on `memory`'s device memory, queued on `stream`;
// `owner` stays alive as long as the kernel (the Context that owns the memory and stream).
// The CPU emulation (sim/) makes one on host memory.
std::unique_ptr<FusedStepKernel> make_fused_step(MemorySpace& memory, cudaStream_t stream, const FusedStepDesc& d,
                                                 std::shared_ptr<const void> owner = nullptr);
inline std::unique_ptr<FusedStepKernel> make_fused_step(const ContextPtr& ctx, const FusedStepDesc& d) {
  return make_fused_step(ctx->memory(), ctx->stream(), d, ctx);
}

// Stream capture of the step (step_graph.cpp).
std::unique_ptr<StepGraph> make_step_graph(const ContextPtr& ctx);

}  // namespace rn::cuda

// RN_LAUNCH(grid, block, stream, kernel)(args...): a kernel launch with no dynamic shared
// memory. Under nvcc it is exactly kernel<<<grid, block, 0, stream>>>(args...). In the CPU
// emulation (backends/cuda/sim, RN_CUDA_SIM) it runs every thread of every block on the host,
// so CI runs our kernels on machines without a GPU (docs/gpu.md, "Our kernels on the CPU").
//
// RN_SIM_CHECK_ALIGNED(p, bytes): a vector access's alignment, checked in the emulation (a
// misaligned access is a fault on the GPU) and nothing under nvcc.
#pragma once

#ifdef RN_CUDA_SIM
#define RN_LAUNCH(grid, block, stream, ...) ::rn::cuda::sim::launch(#__VA_ARGS__, (grid), (block), (stream), __VA_ARGS__)
#define RN_SIM_CHECK_ALIGNED(p, bytes) ::rn::cuda::sim::check_aligned((p), (bytes))
#else
#define RN_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#define RN_SIM_CHECK_ALIGNED(p, bytes) ((void)0)
#endif

// A backend implements every op family's kernels. Kernels are created once per
// descriptor (shape, dtype, layout, parameters) at plan time and then only executed.
// A backend that cannot run a descriptor throws rn::Unsupported from the factory with
// a message saying what and why; it never falls back silently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/build_info.h"
#include "core/memory_space.h"
#include "ops/augment.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/elementwise.h"
#include "ops/fused_step.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/pool.h"

namespace rn {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The activation layout this backend runs fastest with.
  virtual Layout preferred_layout() const = 0;
  // Whether the backend can compute in `dtype` at all on this machine (a factory may
  // still refuse a particular descriptor).
  virtual bool supports_dtype(DType dtype, std::string* why_not) const = 0;
  // Whether make_conv2d takes Conv2dDesc::f32_y and f32_dx (a half convolution writing fp32 y
  // and dx). cuDNN's legacy convolutions take one data type for x, y and their gradients.
  virtual bool conv_f32_outputs() const { return false; }
  // Whether make_batch_norm takes BatchNormDesc::half_y and half_dx (fp32 x, y or dx in
  // `half`) in `layout`.
  virtual bool bn_half_io(Layout /*layout*/, DType /*half*/) const { return false; }

  virtual std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) = 0;
  virtual std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) = 0;
  virtual std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) = 0;
  virtual std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) = 0;
  virtual std::unique_ptr<CastKernel> make_cast(const CastDesc& d) = 0;
  virtual std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) = 0;
  virtual std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) = 0;
  virtual std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) = 0;
  virtual std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) = 0;

  // The one scratch buffer all of this backend's kernels share (sized, at kernel creation,
  // for the largest need), in bytes; 0 when the backend keeps none.
  virtual size_t workspace_bytes() const { return 0; }

  // Waits for all queued work (no-op on synchronous backends).
  virtual void synchronize() {}

  // Where this backend's tensors live: plans allocate their arena, the half weights and
  // the model's flat buffers here. Host memory unless the backend runs on a device.
  virtual MemorySpace& memory() { return host_memory(); }
  // Host memory the device copies from fastest and asynchronously (CUDA: pinned, page-
  // locked); the loader's batch buffers come from here. Plain host memory by default.
  virtual MemorySpace& pinned_memory() { return host_memory(); }
  // The input pipeline's host -> device staging (core/memory_space.h): CUDA double-buffers
  // on a copy stream of its own; the default is one buffer filled synchronously.
  virtual std::unique_ptr<Uploader> make_uploader(size_t bytes) { return make_plain_uploader(memory(), bytes); }

  // The device training step (ops/fused_step.h); host backends run the host optimizer
  // instead and refuse with rn::Unsupported.
  virtual std::unique_ptr<FusedStepKernel> make_fused_step(const FusedStepDesc&) {
    RN_UNSUPPORTED() << "backend '" << name() << "' has no fused device step";
  }
  virtual std::unique_ptr<StepGraph> make_step_graph() {
    RN_UNSUPPORTED() << "backend '" << name() << "' cannot capture a step as a graph (sink mode needs CUDA)";
  }
  // The input pipeline's last step (ops/augment.h); host backends run it on the host.
  virtual std::unique_ptr<CropFlipNormalizeKernel> make_crop_flip_normalize(const CropFlipNormalizeDesc& d) {
    return make_host_crop_flip_normalize(d);
  }
  // One line for the log: the device and its mode.
  virtual std::string describe() const { return name(); }
  // The accelerator's PCI bus id ("0000:19:00.0"; "" for host backends), which names the
  // same GPU to NVML whatever CUDA_VISIBLE_DEVICES renumbers.
  virtual std::string pci_bus_id() const { return {}; }
  // What `resnet tune` reports: the algorithm cache's location and size ("" where none).
  virtual std::string tuning_state() const { return {}; }
  // The stream all kernels are queued on (CUDA: the cudaStream_t), for a device
  // communicator to order its collectives after; nullptr on host backends.
  virtual void* native_stream() { return nullptr; }
};

// Backend-wide choices. high_precision: on a GPU deterministic algorithms only and no
// reduced-precision reductions; on the cpu backend direct convolutions only (no Winograd);
// the ref backend ignores it.
struct BackendOptions {
  bool high_precision = false;
  // Only algorithms with a fixed summation order (run.deterministic; high_precision implies it).
  // The CPU's oneDNN kernels have one already; on a GPU it limits cuDNN's choice.
  bool deterministic = false;
  int device = 0;  // the accelerator's index (a data-parallel rank's World::device)
  Bf16ConvArithmetic cpu_bf16_conv_arithmetic = Bf16ConvArithmetic::automatic;  // the cpu backend only
};

// "ref", "cpu" (oneDNN), "cuda" (when built). An unknown or unavailable name is an error
// that lists the available backends.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});
std::vector<std::string> available_backends();
// Accelerators this process can see (CUDA devices; 0 without a GPU or a CUDA build).
int accelerator_count();
// The libraries the backends of this build run with: oneDNN, and with CUDA the runtime,
// driver, cuDNN and cuBLAS (core/build_info.h). Needs no GPU.
std::vector<LibraryVersion> backend_library_versions();

}  // namespace rn

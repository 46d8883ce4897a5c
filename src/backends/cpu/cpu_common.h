// Private to the CPU backend: the oneDNN engine and stream, the per-call temporary memory
// every kernel shares, dtype/layout translation, and the weight-format helpers used by the
// convolution and linear kernels. Nothing outside src/backends/cpu includes this header.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "core/check.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace rn::cpu {

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// State shared by the backend and every kernel it made (kernels hold it by shared_ptr, so
// they may outlive the Backend object).
//
// Temporary memory: oneDNN scratchpads (user-managed, a Winograd convolution's transformed
// tiles among them), weights reordered into a primitive's format, activations reordered into
// a Winograd convolution's blocked layout and back (so it grows with the batch), fp32
// gradient staging. It lives only during one call, and the kernels of one
// backend run one at a time (one in-order stream), so a single buffer sized for the largest
// call serves them all. It grows when a kernel is created (plan time), never during a call;
// kernels look up its address at every call.
class Context {
 public:
  explicit Context(const CpuBackendOptions& options = {});
  // Whether 3x3 stride-1 fp32 convolutions may use Winograd (high_performance).
  bool winograd() const { return options_.winograd; }
  // Whether NHWC batch norm runs our loops (batch_norm_nhwc.h) rather than oneDNN.
  bool batch_norm_loops() const { return options_.batch_norm_loops; }
  // CpuBackendOptions::bf16_conv_arithmetic, automatic resolved to native on AMX CPUs.
  Bf16ConvArithmetic bf16_conv_arithmetic() const { return options_.bf16_conv_arithmetic; }
  // What automatic goes by: CpuBackendOptions::bf16_speedup, or cpu_bf16_speedup() measured at
  // the first call (and logged, with a warning where it lies close to conv2d.cpp's line, 1).
  double bf16_speedup() const;
  const dnnl::engine& engine() const { return engine_; }
  dnnl::stream& stream() { return stream_; }

  void reserve_temp(size_t bytes);
  char* temp() const { return static_cast<char*>(temp_.data()); }
  size_t temp_bytes() const { return temp_.bytes(); }

  bool native_bf16() const { return native_bf16_; }
  // Throws rn::Unsupported naming `op` unless this CPU can compute in `dtype`.
  void require_compute_dtype(DType dtype, const std::string& op) const;
  bool supports_dtype(DType dtype, std::string* why_not) const;

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  HostBuffer temp_;
  bool native_bf16_ = false;
  CpuBackendOptions options_;
  std::string bf16_why_not_;
  mutable std::mutex speedup_mutex_;
  mutable double measured_speedup_ = 0;
};
using ContextPtr = std::shared_ptr<Context>;

// Offsets of the pieces of one call's temporary memory, each aligned to 64 bytes.
class TempLayout {
 public:
  size_t add(size_t bytes) {
    size_t at = total_;
    total_ = align_up(total_ + bytes, Arena::kAlignment);
    return at;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

dt to_dnnl(DType t);
tag layout_tag(Layout l);  // nchw / nhwc for 4-D activations
// A 4-D activation of logical shape [N, C, H, W] in the user's layout.
dnnl::memory::desc activation_md(const Shape& s, DType t, Layout l);
// A dense tensor of `numel` elements seen as 1-D.
dnnl::memory::desc flat_md(int64_t numel, DType t);

// Primitive attributes with a user-managed scratchpad (and optionally a post-op).
dnnl::primitive_attr user_scratchpad_attr();

// A primitive plus where its scratchpad goes in the call's temporary memory.
struct Step {
  dnnl::primitive prim;
  dnnl::memory::desc scratchpad_md;
  size_t scratchpad_at = 0;
  std::string impl;  // oneDNN's implementation name, for logs
};

template <typename Primitive, typename PD>
Step make_step(const PD& pd, TempLayout& temp) {
  Step s;
  s.prim = Primitive(pd);
  s.scratchpad_md = pd.scratchpad_desc();
  s.scratchpad_at = temp.add(s.scratchpad_md.get_size());
  s.impl = pd.impl_info_str();
  return s;
}

// Runs `step` on the context's stream with the given arguments plus its scratchpad, and
// waits for it.
void execute(Context& ctx, const Step& step, std::unordered_map<int, dnnl::memory> args);

// A memory object over caller-owned data (no copy).
inline dnnl::memory wrap(const Context& ctx, const dnnl::memory::desc& md, const void* data) {
  return dnnl::memory(md, ctx.engine(), const_cast<void*>(data));
}
inline dnnl::memory wrap_temp(const Context& ctx, const dnnl::memory::desc& md, size_t at) {
  return dnnl::memory(md, ctx.engine(), ctx.temp() + at);
}

// Logs the implementations oneDNN chose for a kernel (debug), and warns when one of them
// is a reference implementation (plain loops, orders of magnitude slower).
void log_implementations(const std::string& op, std::initializer_list<const Step*> steps);

// An input given in the caller's layout (weights in PyTorch's OIHW / GOIHW / OI, an
// activation in nhwc / nchw) and fed to a primitive that picked its own format: a cached
// reorder into temporary memory, or nothing when the formats agree.
class ReorderIn {
 public:
  ReorderIn() = default;
  ReorderIn(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md, TempLayout& temp);
  // The memory to pass to the primitive; reorders `user_data` first if needed.
  dnnl::memory prepare(Context& ctx, const void* user_data) const;
  const Step* reorder_step() const { return needs_reorder_ ? &reorder_ : nullptr; }

 private:
  dnnl::memory::desc user_md_, prim_md_;
  bool needs_reorder_ = false;
  Step reorder_;
  size_t buffer_at_ = 0;
};

// An output a primitive writes in its own format: into temporary memory, then reordered
// into the caller's layout (finish); straight into the caller's memory when they agree.
class ReorderOut {
 public:
  ReorderOut() = default;
  ReorderOut(const Context& ctx, const dnnl::memory::desc& prim_md, const dnnl::memory::desc& user_md,
             TempLayout& temp);
  dnnl::memory target(const Context& ctx, void* user_data) const;
  void finish(Context& ctx, void* user_data) const;
  const Step* reorder_step() const { return needs_reorder_ ? &reorder_ : nullptr; }

 private:
  dnnl::memory::desc prim_md_, user_md_;
  bool needs_reorder_ = false;
  Step reorder_;
  size_t buffer_at_ = 0;
};

// An fp32 parameter gradient computed by a primitive into temporary memory in the
// primitive's format, then added into the caller's plain-layout gradient (dw += ...) by a
// reorder with a sum post-op.
class GradAccumulate {
 public:
  GradAccumulate() = default;
  GradAccumulate(const Context& ctx, const dnnl::memory::desc& prim_md, const dnnl::memory::desc& user_md,
                 TempLayout& temp);
  // The memory the primitive writes into.
  dnnl::memory staging(const Context& ctx) const { return wrap_temp(ctx, prim_md_, buffer_at_); }
  // user += staging
  void accumulate(Context& ctx, void* user_data) const;
  const Step* reorder_step() const { return &reorder_; }

 private:
  dnnl::memory::desc prim_md_, user_md_;
  Step reorder_;
  size_t buffer_at_ = 0;
};

// dst[i] += src[i], fp32, for the small per-channel gradients (bias, gamma, beta).
void add_to(float* dst, const float* src, int64_t n);

// dx = dy * (y > 0) over `numel` dense elements (oneDNN eltwise backward of relu, from its
// output). Also used by the fused batch-norm backward.
class ReluMask {
 public:
  ReluMask() = default;
  ReluMask(const Context& ctx, int64_t numel, DType dtype, const std::string& op, TempLayout& temp);
  void run(Context& ctx, void* dx, const void* dy, const void* y) const;
  const Step* step() const { return &bwd_; }

 private:
  dnnl::memory::desc md_;
  Step bwd_;
};

// y = a + b, optionally followed by relu, over `numel` dense elements (oneDNN binary with an
// eltwise post-op; y may alias a). Also used by the fused batch-norm's add_relu.
class AddElementwise {
 public:
  AddElementwise() = default;
  AddElementwise(const Context& ctx, int64_t numel, DType dtype, bool relu, const std::string& op, TempLayout& temp);
  void run(Context& ctx, void* y, const void* a, const void* b) const;
  const Step* step() const { return &add_; }

 private:
  dnnl::memory::desc md_;
  Step add_;
};

// Kernel factories, one per op family (each in its own file).
std::unique_ptr<Conv2dKernel> make_conv2d(const ContextPtr& ctx, const Conv2dDesc& d);
std::unique_ptr<BatchNormKernel> make_batch_norm(const ContextPtr& ctx, const BatchNormDesc& d);
// Whether make_batch_norm takes BatchNormDesc::half_y / half_dx in `layout` with `half`: the
// NHWC loops do (bf16), oneDNN's batch norm does not (Backend::bn_half_io()).
bool batch_norm_half_io(const Context& ctx, Layout layout, DType half);
std::unique_ptr<ReluKernel> make_relu(const ContextPtr& ctx, const EltwiseDesc& d);
std::unique_ptr<AddKernel> make_add(const ContextPtr& ctx, const EltwiseDesc& d);
std::unique_ptr<CastKernel> make_cast(const ContextPtr& ctx, const CastDesc& d);
std::unique_ptr<MaxPoolKernel> make_max_pool(const ContextPtr& ctx, const MaxPoolDesc& d);
std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const ContextPtr& ctx, const GlobalAvgPoolDesc& d);
std::unique_ptr<LinearKernel> make_linear(const ContextPtr& ctx, const LinearDesc& d);
std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const ContextPtr& ctx,
                                                                      const SoftmaxCrossEntropyDesc& d);

// Creates a primitive descriptor, turning oneDNN's "no implementation" into rn::Unsupported
// naming the op (any other oneDNN error becomes rn::Error).
template <typename PD, typename... Args>
PD make_pd(const std::string& op, const char* what, Args&&... args) {
  try {
    return PD(std::forward<Args>(args)...);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented)
      RN_UNSUPPORTED() << op << ": oneDNN " << DNNL_VERSION_MAJOR << "." << DNNL_VERSION_MINOR
                       << " has no implementation of the " << what << " (" << e.what() << ")";
    RN_FAIL() << op << ": oneDNN could not create the " << what << ": " << e.what();
  }
}

}  // namespace rn::cpu

// The CPU backend object, its shared Context (engine, stream, temporary memory, dtype
// policy) and the helpers every CPU kernel uses.
#include "backends/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "backends/cpu/cpu_common.h"
#include "core/log.h"
#include "core/plural.h"

namespace rn {

namespace {

std::string_view isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

// The best of `calls` timed calls of one [M, K] x [K, N] GEMM in `t` after two warm-ups, in
// seconds. The operands hold 0x3f bytes (about 0.75 in both types: no denormals, no overflow).
double best_gemm_seconds(dnnl::memory::data_type t, int calls) {
  constexpr int64_t kM = 2048, kK = 256, kN = 256;
  using tag = dnnl::memory::format_tag;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const dnnl::memory::desc a_md({kM, kK}, t, tag::ab), b_md({kK, kN}, t, tag::ab), c_md({kM, kN}, t, tag::ab);
  const dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
  dnnl::memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
  std::memset(a.get_data_handle(), 0x3f, a_md.get_size());
  std::memset(b.get_data_handle(), 0x3f, b_md.get_size());
  const std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  double best = 0;
  for (int i = -2; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    prim.execute(stream, args);
    stream.wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 0) best = i == 0 ? s : std::min(best, s);
  }
  return best;
}

}  // namespace

double cpu_bf16_speedup() {
  static std::mutex mutex;
  static std::map<int, double> by_threads;
  const std::lock_guard lock(mutex);
  const int threads = omp_get_max_threads();
  if (const auto it = by_threads.find(threads); it != by_threads.end()) return it->second;
  RN_CHECK(cpu_has_native_bf16(nullptr)) << "cpu_bf16_speedup: this CPU has no native bf16 arithmetic";
  double speedup = 0;
  try {
    // fp32 before and after bf16, the faster taken: a load that comes and goes is seen by both.
    double f32 = best_gemm_seconds(dnnl::memory::data_type::f32, 5);
    const double bf16 = best_gemm_seconds(dnnl::memory::data_type::bf16, 5);
    f32 = std::min(f32, best_gemm_seconds(dnnl::memory::data_type::f32, 3));
    speedup = f32 / bf16;
  } catch (const dnnl::error& e) {
    RN_FAIL() << "cpu backend: the bf16/fp32 GEMM measurement failed in oneDNN: " << e.what();
  }
  by_threads.emplace(threads, speedup);
  // What automatic (conv2d.cpp) makes of it. Near its line a noisy measurement may go either
  // way from one run to the next, and with it the summation order: said, with the key that fixes it.
  const double s = speedup;
  const bool near = s > 0.8 && s < 1.25;
  const std::string what = s >= 1 ? "natively (oneDNN's bf16 kernels)"
                                  : "in fp32 arithmetic where they do 96 or more multiply-adds per activation element";
  if (near) {
    RN_LOG_WARN(
        "cpu backend: bf16 GEMM measured at {:.2f}x the fp32 rate ({}), close to the line (1) the automatic "
        "choice of arithmetic draws: bf16 convolutions compute {} (run.cpu_bf16_conv_arithmetic auto), and another "
        "run may choose otherwise; set it to native or fp32 to fix the choice",
        s, counted(threads, "thread"), what);
  } else {
    RN_LOG_INFO(
        "cpu backend: bf16 GEMM measured at {:.2f}x the fp32 rate ({}): bf16 convolutions compute {} "
        "(run.cpu_bf16_conv_arithmetic auto)",
        s, counted(threads, "thread"), what);
  }
  return speedup;
}

// oneDNN's effective ISA already accounts for cpuid, the OS (XSAVE state for AMX) and a
// DNNL_MAX_CPU_ISA limit. Its ISA values are bit sets, each containing the ones below it.
bool cpu_has_winograd() {
  const auto bits = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (bits & avx512) == avx512;
}

bool cpu_has_amx() {
  const auto bits = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (bits & amx) == amx;
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

bool cpu_has_native_bf16(std::string* why) {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  const auto bits = static_cast<unsigned>(isa);
  const auto bf16_bits = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((bits & bf16_bits) == bf16_bits) return true;
  if (why != nullptr) {
    std::ostringstream s;
    s << "this CPU has no native bf16 arithmetic (oneDNN's best ISA here is " << isa_name(isa)
      << "; bf16 needs avx512_bf16 or amx_bf16)";
    if (const char* limit = std::getenv("DNNL_MAX_CPU_ISA")) s << " [DNNL_MAX_CPU_ISA=" << limit << " is set]";
    s << "; bf16 would run emulated and slowly, so it is refused: use fp32 (precision level O0) on this machine";
    *why = s.str();
  }
  return false;
}

namespace cpu {

Context::Context(const CpuBackendOptions& options)
    : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_), options_(options) {
  native_bf16_ = cpu_has_native_bf16(&bf16_why_not_);
  RN_CHECK(options_.bf16_speedup >= 0) << "CpuBackendOptions::bf16_speedup " << options_.bf16_speedup
                                       << ": a rate ratio, or 0 to measure it";
  // AMX's tile multiplies are many times fp32's rate: nothing to measure.
  if (options_.bf16_conv_arithmetic == Bf16ConvArithmetic::automatic && options_.bf16_speedup == 0 && cpu_has_amx())
    options_.bf16_conv_arithmetic = Bf16ConvArithmetic::native;
}

double Context::bf16_speedup() const {
  if (options_.bf16_speedup > 0) return options_.bf16_speedup;
  const std::lock_guard lock(speedup_mutex_);
  if (measured_speedup_ == 0) measured_speedup_ = cpu_bf16_speedup();
  return measured_speedup_;
}

void Context::reserve_temp(size_t bytes) {
  if (bytes <= temp_.bytes()) return;
  temp_ = HostBuffer(bytes);
  temp_.zero();  // once, at plan time: no call ever reads memory nobody wrote
}

bool Context::supports_dtype(DType dtype, std::string* why_not) const {
  std::string why;
  switch (dtype) {
    case DType::f32: return true;
    case DType::bf16:
      if (native_bf16_) return true;
      why = bf16_why_not_;
      break;
    case DType::f16:
      why =
          "fp16 is not supported by the CPU backend: oneDNN 2.6 has no fp16 training kernels for x86 CPUs "
          "(fp16 arithmetic would be emulated); use bf16 on CPUs with avx512_bf16/amx, or fp32";
      break;
    default: why = std::string(dtype_name(dtype)) + " is not a floating compute type"; break;
  }
  if (why_not != nullptr) *why_not = why;
  return false;
}

void Context::require_compute_dtype(DType dtype, const std::string& op) const {
  std::string why;
  if (!supports_dtype(dtype, &why)) RN_UNSUPPORTED() << "cpu backend, " << op << ": " << why;
}

dt to_dnnl(DType t) {
  switch (t) {
    case DType::f32: return dt::f32;
    case DType::bf16: return dt::bf16;
    case DType::f16: return dt::f16;
    case DType::i32: return dt::s32;
    case DType::u8: return dt::u8;
  }
  RN_FAIL() << "unknown dtype " << static_cast<int>(t);
}

tag layout_tag(Layout l) { return l == Layout::nchw ? tag::nchw : tag::nhwc; }

dnnl::memory::desc activation_md(const Shape& s, DType t, Layout l) {
  RN_CHECK_EQ(s.rank(), 4) << "activation_md wants a 4-D shape, got " << s.str();
  return dnnl::memory::desc({s[0], s[1], s[2], s[3]}, to_dnnl(t), layout_tag(l));
}

dnnl::memory::desc flat_md(int64_t numel, DType t) { return dnnl::memory::desc({numel}, to_dnnl(t), tag::a); }

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void execute(Context& ctx, const Step& step, std::unordered_map<int, dnnl::memory> args) {
  if (step.scratchpad_md.get_size() > 0) {
    args.emplace(DNNL_ARG_SCRATCHPAD, wrap_temp(ctx, step.scratchpad_md, step.scratchpad_at));
  }
  try {
    step.prim.execute(ctx.stream(), args);
    ctx.stream().wait();
  } catch (const dnnl::error& e) {
    RN_FAIL() << "cpu backend: oneDNN primitive " << step.impl << " failed: " << e.what();
  }
}

void log_implementations(const std::string& op, std::initializer_list<const Step*> steps) {
  std::string list;
  bool reference = false;
  for (const Step* s : steps) {
    if (s == nullptr) continue;
    list += (list.empty() ? "" : ", ") + s->impl;
    reference = reference || s->impl.rfind("ref", 0) == 0;
  }
  if (reference) {
    RN_LOG_WARN("cpu backend: {} runs a oneDNN reference implementation (slow): {}", op, list);
  } else {
    RN_LOG_DEBUG("cpu backend: {}: {}", op, list);
  }
}

ReorderIn::ReorderIn(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md,
                     TempLayout& temp)
    : user_md_(user_md), prim_md_(prim_md), needs_reorder_(user_md != prim_md) {
  if (!needs_reorder_) return;
  dnnl::reorder::primitive_desc pd(ctx.engine(), user_md_, ctx.engine(), prim_md_, user_scratchpad_attr());
  reorder_ = make_step<dnnl::reorder>(pd, temp);
  buffer_at_ = temp.add(prim_md_.get_size());
}

dnnl::memory ReorderIn::prepare(Context& ctx, const void* user_data) const {
  if (!needs_reorder_) return wrap(ctx, user_md_, user_data);
  dnnl::memory out = wrap_temp(ctx, prim_md_, buffer_at_);
  execute(ctx, reorder_, {{DNNL_ARG_FROM, wrap(ctx, user_md_, user_data)}, {DNNL_ARG_TO, out}});
  return out;
}

ReorderOut::ReorderOut(const Context& ctx, const dnnl::memory::desc& prim_md, const dnnl::memory::desc& user_md,
                       TempLayout& temp)
    : prim_md_(prim_md), user_md_(user_md), needs_reorder_(prim_md != user_md) {
  if (!needs_reorder_) return;
  dnnl::reorder::primitive_desc pd(ctx.engine(), prim_md_, ctx.engine(), user_md_, user_scratchpad_attr());
  reorder_ = make_step<dnnl::reorder>(pd, temp);
  buffer_at_ = temp.add(prim_md_.get_size());
}

dnnl::memory ReorderOut::target(const Context& ctx, void* user_data) const {
  return needs_reorder_ ? wrap_temp(ctx, prim_md_, buffer_at_) : wrap(ctx, user_md_, user_data);
}

void ReorderOut::finish(Context& ctx, void* user_data) const {
  if (!needs_reorder_) return;
  execute(ctx, reorder_,
          {{DNNL_ARG_FROM, wrap_temp(ctx, prim_md_, buffer_at_)}, {DNNL_ARG_TO, wrap(ctx, user_md_, user_data)}});
}

GradAccumulate::GradAccumulate(const Context& ctx, const dnnl::memory::desc& prim_md, const dnnl::memory::desc& user_md,
                               TempLayout& temp)
    : prim_md_(prim_md), user_md_(user_md) {
  dnnl::primitive_attr attr = user_scratchpad_attr();
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  attr.set_post_ops(sum);
  dnnl::reorder::primitive_desc pd(ctx.engine(), prim_md_, ctx.engine(), user_md_, attr);
  reorder_ = make_step<dnnl::reorder>(pd, temp);
  buffer_at_ = temp.add(prim_md_.get_size());
}

void GradAccumulate::accumulate(Context& ctx, void* user_data) const {
  execute(ctx, reorder_, {{DNNL_ARG_FROM, staging(ctx)}, {DNNL_ARG_TO, wrap(ctx, user_md_, user_data)}});
}

void add_to(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : ctx_(std::make_shared<Context>(options)) {}
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }
  Layout preferred_layout() const override { return Layout::nhwc; }
  bool supports_dtype(DType dtype, std::string* why_not) const override { return ctx_->supports_dtype(dtype, why_not); }
  bool conv_f32_outputs() const override { return true; }
  bool bn_half_io(Layout layout, DType half) const override { return cpu::batch_norm_half_io(*ctx_, layout, half); }
  size_t workspace_bytes() const override { return ctx_->temp_bytes(); }
  std::string describe() const override {
    std::string s = !ctx_->winograd()    ? "cpu, implementation mode high_precision (direct convolutions"
                    : cpu_has_winograd() ? "cpu, implementation mode high_performance (Winograd for 3x3 convolutions "
                                           "where it pays"
                                         : "cpu, implementation mode high_performance (direct convolutions: no "
                                           "AVX-512 here for Winograd";
    using A = Bf16ConvArithmetic;
    if (ctx_->native_bf16() && ctx_->bf16_conv_arithmetic() == A::automatic)
      s += "; bf16 convolutions native where a bf16/fp32 GEMM timing finds bf16 as fast, else in fp32 arithmetic where "
           "it pays";
    else if (ctx_->native_bf16() && ctx_->bf16_conv_arithmetic() == A::fp32)
      s += "; bf16 convolutions in fp32 arithmetic";
    return s + ")";
  }

  std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dDesc& d) override { return cpu::make_conv2d(ctx_, d); }
  std::unique_ptr<BatchNormKernel> make_batch_norm(const BatchNormDesc& d) override {
    return cpu::make_batch_norm(ctx_, d);
  }
  std::unique_ptr<ReluKernel> make_relu(const EltwiseDesc& d) override { return cpu::make_relu(ctx_, d); }
  std::unique_ptr<AddKernel> make_add(const EltwiseDesc& d) override { return cpu::make_add(ctx_, d); }
  std::unique_ptr<CastKernel> make_cast(const CastDesc& d) override { return cpu::make_cast(ctx_, d); }
  std::unique_ptr<MaxPoolKernel> make_max_pool(const MaxPoolDesc& d) override { return cpu::make_max_pool(ctx_, d); }
  std::unique_ptr<GlobalAvgPoolKernel> make_global_avg_pool(const GlobalAvgPoolDesc& d) override {
    return cpu::make_global_avg_pool(ctx_, d);
  }
  std::unique_ptr<LinearKernel> make_linear(const LinearDesc& d) override { return cpu::make_linear(ctx_, d); }
  std::unique_ptr<SoftmaxCrossEntropyKernel> make_softmax_cross_entropy(const SoftmaxCrossEntropyDesc& d) override {
    return cpu::make_softmax_cross_entropy(ctx_, d);
  }
  void synchronize() override { ctx_->stream().wait(); }

 private:
  ContextPtr ctx_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace rn

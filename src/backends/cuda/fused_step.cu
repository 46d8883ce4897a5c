// The fused training step on the device: overflow check, loss-scale update, and the
// optimizer pass over the flat buffers, with no host synchronisation. Work is split into
// segments of at most kSegment elements of one parameter each (as the CPU optimizer
// does); LARS norms are summed per segment in double and then per parameter in segment
// order, so results are the same on every run.
#include <memory>
#include <vector>

#include "backends/cuda/device_types.cuh"
#include "backends/cuda/fused_step.h"

namespace rn::cuda {
namespace {

constexpr int64_t kSegment = 1 << 15;
constexpr int kThreads = 256;

struct Segment {
  int32_t param;
  int64_t begin, end;
};

// Device state, one struct so that it is one allocation and one copy.
struct StepState {
  fused::LossScaleCounters counters;
  float loss_scale;      // what the loss kernel multiplies by (the current scale)
  float inv_scale_used;  // 1 / the scale this step's gradients carry
  float lr;              // this step's rate
  int overflow;          // set by the check kernel
  int applied;           // the rule's verdict
  int lr_index;          // next entry of the lr table
};

__global__ void overflow_check_kernel(int* overflow, const float* g, int64_t n) {
  int bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    bad |= fused::is_inf_or_nan_bits(__float_as_uint(g[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

// From the table: this step's rate, and the batch's loss recorded in the same slot.
// A change of the scale goes to the change record, which the host reads at its next
// synchronisation.
__global__ void scale_update_kernel(StepState* st, fused::LossScaleChangeLog* changes, fused::LossScaleRule rule,
                                    float lr, const float* lr_table, int lr_table_size, const float* loss,
                                    float* losses) {
  st->inv_scale_used = static_cast<float>(1.0 / st->counters.scale);
  const fused::LossScaleCounters before = st->counters;
  st->applied = fused::loss_scale_update(st->counters, rule, st->overflow != 0) ? 1 : 0;
  fused::record_scale_change(*changes, before, st->counters, st->overflow != 0);
  st->overflow = 0;  // ready for the next step
  st->loss_scale = static_cast<float>(st->counters.scale);
  if (lr_table) {
    const int i = st->lr_index < lr_table_size ? st->lr_index : lr_table_size - 1;
    st->lr = lr_table[i];
    if (loss) losses[i] = *loss;
    ++st->lr_index;
  } else {
    st->lr = lr;
  }
}

// One block per segment: sums of squares of w and of the unscaled g.
__global__ void lars_norms_kernel(double* seg_w2, double* seg_g2, const Segment* segs, const int* adapt, const float* w,
                                  const float* g, const StepState* st) {
  __shared__ double sw[kThreads], sg[kThreads];
  const Segment s = segs[blockIdx.x];
  double a = 0.0, b = 0.0;
  if (adapt[s.param] && st->applied) {
    const float m = st->inv_scale_used;
    for (int64_t i = s.begin + threadIdx.x; i < s.end; i += blockDim.x) {
      a += static_cast<double>(w[i]) * w[i];
      const double gi = static_cast<double>(g[i]) * m;
      b += gi * gi;
    }
  }
  sw[threadIdx.x] = a;
  sg[threadIdx.x] = b;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < static_cast<unsigned>(stride)) sw[threadIdx.x] += sw[threadIdx.x + stride], sg[threadIdx.x] += sg[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) seg_w2[blockIdx.x] = sw[0], seg_g2[blockIdx.x] = sg[0];
}

__global__ void lars_trust_kernel(double* trust, const double* seg_w2, const double* seg_g2, const int* first_seg,
                                  const int* adapt, const float* wd, int n_params, double eta, double eps) {
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < n_params; p += blockDim.x * gridDim.x) {
    double w2 = 0, g2 = 0;
    for (int s = first_seg[p]; s < first_seg[p + 1]; ++s) w2 += seg_w2[s], g2 += seg_g2[s];
    trust[p] = adapt[p] ? fused::lars_trust_ratio(sqrt(w2), sqrt(g2), wd[p], eta, eps) : 1.0;
  }
}

template <typename H>
__global__ void update_kernel(float* w, float* buf, const float* g, H* half, const Segment* segs, const float* wd,
                              const double* trust, const StepState* st, bool lars, bool nesterov, float momentum,
                              bool round_master) {
  if (!st->applied) return;  // an overflowing step leaves everything untouched
  const Segment s = segs[blockIdx.x];
  const float m = st->inv_scale_used, decay = wd[s.param];
  const float lr = lars ? static_cast<float>(static_cast<double>(st->lr) * trust[s.param]) : st->lr;
  for (int64_t i = s.begin + threadIdx.x; i < s.end; i += blockDim.x) {
    float wi = w[i], bi = buf[i];
    if (lars)
      fused::lars_update_element(wi, bi, g[i] * m, decay, lr, momentum, nesterov);
    else
      fused::sgd_update_element(wi, bi, g[i] * m, decay, lr, momentum, nesterov);
    if (round_master) wi = to_f32<H>(from_f32<H>(wi));
    w[i] = wi;
    buf[i] = bi;
    if (half) half[i] = from_f32<H>(wi);
  }
}

class CudaFusedStep final : public FusedStepKernel {
 public:
  CudaFusedStep(const ContextPtr& ctx, const FusedStepDesc& d)
      : FusedStepKernel(d), ctx_(ctx), mem_(ctx->memory()), stream_(ctx->stream()) {
    std::vector<Segment> segs;
    std::vector<int> first(1, 0), adapt;
    std::vector<float> wd;
    for (size_t i = 0; i < d.params.size(); ++i) {
      const FusedParam& p = d.params[i];
      for (int64_t b = p.offset; b < p.offset + p.numel; b += kSegment)
        segs.push_back({static_cast<int32_t>(i), b, std::min(b + kSegment, p.offset + p.numel)});
      first.push_back(static_cast<int>(segs.size()));
      adapt.push_back(d.optimizer == FusedOptimizer::lars && p.lars_adapt ? 1 : 0);
      wd.push_back(p.weight_decay);
    }
    segments_ = static_cast<int>(segs.size());
    n_params_ = static_cast<int>(d.params.size());
    MemorySpace& mem = mem_;
    auto upload = [&](DeviceBuffer& buf, const void* host, size_t bytes) {
      buf = DeviceBuffer(mem, bytes);
      if (bytes) mem.copy(buf.data(), host, bytes);
    };
    upload(segs_, segs.data(), segs.size() * sizeof(Segment));
    upload(first_, first.data(), first.size() * sizeof(int));
    upload(adapt_, adapt.data(), adapt.size() * sizeof(int));
    upload(wd_, wd.data(), wd.size() * sizeof(float));
    seg_w2_ = DeviceBuffer(mem, static_cast<size_t>(segments_ + 1) * sizeof(double));
    seg_g2_ = DeviceBuffer(mem, static_cast<size_t>(segments_ + 1) * sizeof(double));
    trust_ = DeviceBuffer(mem, static_cast<size_t>(n_params_ + 1) * sizeof(double));
    momentum_ = DeviceBuffer(mem, static_cast<size_t>(d.total) * sizeof(float));
    momentum_.zero();
    state_ = DeviceBuffer(mem, sizeof(StepState));
    changes_ = DeviceBuffer(mem, sizeof(fused::LossScaleChangeLog));
    changes_.zero();
    StepState st{};
    st.counters.scale = 1.0;
    st.loss_scale = 1.0f;
    mem.copy(state_.data(), &st, sizeof(st));
  }

  Tensor loss_scale_tensor() const override {
    Tensor t;
    t.data = &state()->loss_scale;
    t.shape = {1};
    t.dtype = DType::f32;
    t.device = Device::cuda;
    return t;
  }

  // A captured step holds the table's and the losses' addresses: windows of one size reuse
  // them; a larger table moves them, and a graph captured before is then stale (captured()).
  void set_lr_table(const std::vector<float>& lrs) override {
    RN_CHECK(!lrs.empty()) << "fused step: empty learning-rate table";
    if (lr_table_.bytes() < lrs.size() * sizeof(float)) {
      lr_table_ = DeviceBuffer(mem_, lrs.size() * 4);
      losses_ = DeviceBuffer(mem_, lrs.size() * 4);
      ctx_->captured_memory_moved();
    }
    mem_.copy(lr_table_.data(), lrs.data(), lrs.size() * sizeof(float));
    lr_table_size_ = static_cast<int>(lrs.size());
    const int zero = 0;
    mem_.copy(&state()->lr_index, &zero, sizeof(int));
  }
  std::vector<float> table_losses(int n) const override {
    RN_CHECK(n >= 0 && n <= lr_table_size_)
        << "fused step: losses of " << n << " steps asked, the table holds " << lr_table_size_;
    std::vector<float> v(static_cast<size_t>(n));
    if (n > 0) mem_.copy(v.data(), losses_.data(), v.size() * sizeof(float));
    return v;
  }

  fused::LossScaleCounters counters() const override {
    StepState st{};
    mem_.copy(&st, state_.data(), sizeof(st));
    return st.counters;
  }
  void set_counters(const fused::LossScaleCounters& c) override {
    StepState st{};
    mem_.copy(&st, state_.data(), sizeof(st));
    st.counters = c;
    st.loss_scale = static_cast<float>(c.scale);
    mem_.copy(state_.data(), &st, sizeof(st));
    changes_.zero();
  }
  fused::LossScaleChangeLog scale_changes() const override {
    fused::LossScaleChangeLog log;
    mem_.copy(&log, changes_.data(), sizeof(log));
    return log;
  }
  void read_momentum(float* host) const override { mem_.copy(host, momentum_.data(), momentum_.bytes()); }
  void write_momentum(const float* host) override { mem_.copy(momentum_.data(), host, momentum_.bytes()); }

 protected:
  void do_step(const Tensor& weights, const Tensor& grads, const Tensor* half_weights, float lr) override {
    cudaStream_t s = stream_;
    const int64_t n = desc_.total;
    StepState* st = state();
    RN_LAUNCH(blocks_for(n, kThreads), kThreads, s, overflow_check_kernel)(&st->overflow, grads.ptr<float>(), n);
    RN_CUDA_LAUNCH_CHECK();
    const bool from_table = lr < 0.0f;
    RN_CHECK(!from_table || lr_table_size_ > 0) << "fused step: no learning-rate table set";
    RN_LAUNCH(1, 1, s, scale_update_kernel)
    (st, static_cast<fused::LossScaleChangeLog*>(changes_.data()), desc_.loss_scale, lr,
     from_table ? static_cast<const float*>(lr_table_.data()) : nullptr, lr_table_size_,
     from_table ? loss_source_ : nullptr, static_cast<float*>(losses_.data()));
    RN_CUDA_LAUNCH_CHECK();
    if (segments_ == 0) return;
    const bool lars = desc_.optimizer == FusedOptimizer::lars;
    if (lars) {
      RN_LAUNCH(segments_, kThreads, s, lars_norms_kernel)(seg_w2(), seg_g2(), segs(), adapt(), weights.ptr<float>(),
                                                       grads.ptr<float>(), st);
      RN_CUDA_LAUNCH_CHECK();
      RN_LAUNCH(blocks_for(n_params_, kThreads), kThreads, s, lars_trust_kernel)(
          trust(), seg_w2(), seg_g2(), static_cast<const int*>(first_.data()), adapt(), wd(), n_params_, desc_.lars_eta,
          desc_.lars_eps);
      RN_CUDA_LAUNCH_CHECK();
    }
    const DType h = desc_.half == DType::f32 ? DType::f16 : desc_.half;  // the type to round to (O3)
    RN_DISPATCH_FLOAT(h, H, {
      RN_LAUNCH(segments_, kThreads, s, update_kernel<H>)(
          weights.ptr<float>(), static_cast<float*>(momentum_.data()), grads.ptr<float>(),
          half_weights ? static_cast<H*>(half_weights->data) : nullptr, segs(), wd(), trust(), st, lars, desc_.nesterov,
          desc_.momentum, desc_.round_master_to_half && desc_.half != DType::f32);
      RN_CUDA_LAUNCH_CHECK();
    });
  }

 private:
  StepState* state() const { return static_cast<StepState*>(state_.data()); }
  const Segment* segs() const { return static_cast<const Segment*>(segs_.data()); }
  const int* adapt() const { return static_cast<const int*>(adapt_.data()); }
  const float* wd() const { return static_cast<const float*>(wd_.data()); }
  double* trust() const { return static_cast<double*>(trust_.data()); }
  double* seg_w2() const { return static_cast<double*>(seg_w2_.data()); }
  double* seg_g2() const { return static_cast<double*>(seg_g2_.data()); }

  ContextPtr ctx_;  // first: outlives the buffers below, which its memory frees
  MemorySpace& mem_;
  cudaStream_t stream_;
  int segments_ = 0, n_params_ = 0, lr_table_size_ = 0;
  DeviceBuffer segs_, first_, adapt_, wd_, seg_w2_, seg_g2_, trust_, momentum_, state_, changes_, lr_table_, losses_;
};

}  // namespace

std::unique_ptr<FusedStepKernel> make_fused_step(const ContextPtr& ctx, const FusedStepDesc& d) {
  return std::make_unique<CudaFusedStep>(ctx, d);
}

}  // namespace rn::cuda

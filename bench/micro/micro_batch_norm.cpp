// Micro-benchmarks of single kernels (Google Benchmark): the cpu backend's batch norm on
// ResNet-50's shapes at batch 16, NHWC, our loops (backends/cpu/batch_norm_nhwc.h) against
// oneDNN's batch norm with its separate add+ReLU and ReLU-mask passes
// (CpuBackendOptions::batch_norm_loops = false), and the synchronised batch norm
// (dist.sync_bn) with a reducer of one rank (no communication: the loops alone), forward
// (training) and backward apart.
//
//   build/bench/micro/rn_micro                                  # all, about a minute
//   build/bench/micro/rn_micro --benchmark_filter='Backward/.*/bf16'
//
// Each case's name is <pass>/<layer shape>/<dtype>/<implementation>; the time is wall
// time per call with the backend's OpenMP threads (OMP_NUM_THREADS); `bytes_per_second`
// counts the tensors the pass must read and write at least (x, y, [residual]; backward:
// dy, x, y, dx, [dresidual]), so it compares with a streaming copy.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "micro.h"
#include "ops/backend.h"

namespace rn {
namespace {

enum class Impl { loops, onednn, sync };
const char* impl_name(Impl i) { return i == Impl::loops ? "loops" : i == Impl::onednn ? "onednn" : "sync"; }

// A world of one rank: the sums stay as they are.
struct OneRank final : BatchStatsReducer {
  void sum(double*, int64_t) override {}
};

struct Shape16 {
  const char* name;
  int64_t channels, size;
  BnFuse fuse;
};
// The distinct batch norms of torchvision's ResNet-50 at 224x224 (batch 16).
const Shape16 kShapes[] = {
    {"bn1_64x112_relu", 64, 112, BnFuse::relu},          {"l1_64x56_relu", 64, 56, BnFuse::relu},
    {"l1_256x56_add_relu", 256, 56, BnFuse::add_relu},   {"l2_128x28_relu", 128, 28, BnFuse::relu},
    {"l2_512x28_add_relu", 512, 28, BnFuse::add_relu},   {"l3_256x14_relu", 256, 14, BnFuse::relu},
    {"l3_1024x14_add_relu", 1024, 14, BnFuse::add_relu}, {"l4_512x7_relu", 512, 7, BnFuse::relu},
    {"l4_2048x7_add_relu", 2048, 7, BnFuse::add_relu},
};

// Everything one batch norm call needs, filled with values of the right kind (x with a
// non-zero mean, y from a real forward so that the ReLU mask is realistic).
struct Setup {
  OneRank one_rank;  // outlives the kernel that holds it
  std::unique_ptr<Backend> backend;
  std::unique_ptr<BatchNormKernel> kernel;
  HostTensor x, y, res, dy, dx, dres, gamma, beta, rmean, rvar, smean, sinvstd, dgamma, dbeta;
  bool add = false;

  Setup(const Shape16& s, DType dtype, Impl impl, std::string* skip) {
    CpuBackendOptions o;
    o.batch_norm_loops = impl != Impl::onednn;
    backend = make_cpu_backend(o);
    if (!backend->supports_dtype(dtype, skip)) return;
    BatchNormDesc d;
    d.batch = 16, d.channels = s.channels, d.h = d.w = s.size, d.fuse = s.fuse, d.dtype = dtype;
    d.layout = Layout::nhwc;
    kernel = backend->make_batch_norm(d);
    if (impl == Impl::sync) kernel->set_stats_reducer(&one_rank);
    add = s.fuse == BnFuse::add_relu;
    const Shape xs = d.x_shape(), cs = {s.channels};
    for (HostTensor* t : {&x, &y, &res, &dy, &dx, &dres}) *t = HostTensor(xs, dtype, Layout::nhwc);
    for (HostTensor* t : {&gamma, &beta, &rmean, &rvar, &smean, &sinvstd, &dgamma, &dbeta}) {
      *t = HostTensor(cs, DType::f32);
      std::memset(t->view().data, 0, t->view().bytes());
    }
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((i * 2654435761u) % 1000) / 500.0f;  // [0, 2): mean 1
      set(x, i, v);
      set(res, i, 1.0f - v);
      set(dy, i, 0.01f * (v - 1.0f));
    }
    for (int64_t c = 0; c < s.channels; ++c) gamma.ptr<float>()[c] = 1.0f, rvar.ptr<float>()[c] = 1.0f;
    forward();
  }
  static void set(const HostTensor& t, int64_t i, float v) {
    if (t.view().dtype == DType::bf16)
      t.ptr<bf16_t>()[i] = f32_to_bf16(v);
    else
      t.ptr<float>()[i] = v;
  }
  void forward() {
    kernel->forward_training(y, smean, sinvstd, x, add ? &res.view() : nullptr, gamma, beta, rmean, rvar);
  }
  void backward() {
    kernel->backward(dx, add ? &dres.view() : nullptr, dgamma, dbeta, dy, x, y, gamma, smean, sinvstd);
  }
};

void run(benchmark::State& state, const Shape16& s, DType dtype, Impl impl, bool backward) {
  std::string skip;
  Setup k(s, dtype, impl, &skip);
  if (!k.kernel) {
    state.SkipWithError(skip.c_str());
    return;
  }
  for (auto _ : state) {
    if (backward)
      k.backward();
    else
      k.forward();
  }
  const auto tensor = static_cast<int64_t>(k.x.view().bytes());
  const int64_t tensors = backward ? (k.add ? 5 : 4) : (k.add ? 3 : 2);
  state.SetBytesProcessed(state.iterations() * tensors * tensor);
}

}  // namespace

// Registered explicitly (no static initialisers in a library): one case per shape, dtype,
// implementation and pass.
void register_batch_norm() {
  for (const Shape16& s : kShapes)
    for (const bool backward : {false, true})
      for (const DType dtype : {DType::f32, DType::bf16})
        for (const Impl impl : {Impl::loops, Impl::onednn, Impl::sync}) {
          const std::string name = std::string(backward ? "Backward/" : "Forward/") + s.name + "/" +
                                   std::string(dtype_name(dtype)) + "/" + impl_name(impl);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, s, dtype, impl, backward); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
}

}  // namespace rn

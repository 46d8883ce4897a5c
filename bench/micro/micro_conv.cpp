// Micro-benchmarks of the cpu backend's convolutions on ResNet-50's shapes at batch 16,
// NHWC: fp32, and bf16 in its two arithmetics (CpuBackendOptions::bf16_conv_arithmetic):
// oneDNN's bf16 kernels (`native`) against the same bf16 tensors widened to fp32 for its
// fp32 kernels and the output rounded back (`fp32`: every shape, also those that
// `automatic` leaves native), so the threshold in backends/cpu/conv2d.cpp can be checked
// from both sides.
//
//   build/bench/micro/rn_micro --benchmark_filter='Conv/'
//   build/bench/micro/rn_micro --benchmark_filter='Conv/.*/l3_'
//
// Each case's name is Conv/<pass>/<layer>/<dtype>/<arithmetic>; the time is wall time per
// call with the backend's OpenMP threads (OMP_NUM_THREADS); `items_per_second` counts
// multiply-adds, and the label is the kernel oneDNN chose.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "micro.h"
#include "ops/backend.h"

namespace rn {
namespace {

struct ConvShape {
  const char* name;
  int64_t in, out, kernel, stride, size;  // size: the input's height and width
};
// The distinct convolutions of torchvision's ResNet-50 (v1.5: stride in the 3x3) at 224x224.
const ConvShape kConvs[] = {
    {"stem_3x64_7x7s2", 3, 64, 7, 2, 224},      {"l1_64x64_1x1", 64, 64, 1, 1, 56},
    {"l1_64x64_3x3", 64, 64, 3, 1, 56},         {"l1_64x256_1x1", 64, 256, 1, 1, 56},
    {"l1_256x64_1x1", 256, 64, 1, 1, 56},       {"l2_256x128_1x1", 256, 128, 1, 1, 56},
    {"l2_128x128_3x3s2", 128, 128, 3, 2, 56},   {"l2_128x128_3x3", 128, 128, 3, 1, 28},
    {"l2_128x512_1x1", 128, 512, 1, 1, 28},     {"l2_512x128_1x1", 512, 128, 1, 1, 28},
    {"l2_down_256x512_s2", 256, 512, 1, 2, 56}, {"l3_512x256_1x1", 512, 256, 1, 1, 28},
    {"l3_256x256_3x3", 256, 256, 3, 1, 14},     {"l3_256x1024_1x1", 256, 1024, 1, 1, 14},
    {"l3_1024x256_1x1", 1024, 256, 1, 1, 14},   {"l4_512x512_3x3", 512, 512, 3, 1, 7},
    {"l4_512x2048_1x1", 512, 2048, 1, 1, 7},    {"l4_2048x512_1x1", 2048, 512, 1, 1, 7},
};

enum class Pass { forward, backward_data, backward_weights };
const char* pass_name(Pass p) {
  return p == Pass::forward ? "Forward" : p == Pass::backward_data ? "BackwardData" : "BackwardWeights";
}
using Arith = CpuBackendOptions::Bf16ConvArithmetic;

// Random-looking values in [-1, 1) (the data's values do not change a convolution's speed).
void fill(HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1;
  convert(t.view().data, t.view().dtype, v.data(), DType::f32, v.size());
}

void run(benchmark::State& state, const ConvShape& s, Pass pass, DType dtype, Arith arith) {
  CpuBackendOptions o;
  o.bf16_conv_arithmetic = arith;
  auto backend = make_cpu_backend(o);
  std::string skip;
  if (!backend->supports_dtype(dtype, &skip)) {
    state.SkipWithError(skip.c_str());
    return;
  }
  Conv2dDesc d;
  d.p.in_channels = s.in;
  d.p.out_channels = s.out;
  d.p.kernel_h = d.p.kernel_w = s.kernel;
  d.p.stride_h = d.p.stride_w = s.stride;
  d.p.pad_h = d.p.pad_w = s.kernel / 2;
  d.batch = 16;
  d.in_h = d.in_w = s.size;
  d.dtype = dtype;
  d.layout = Layout::nhwc;
  auto kernel = backend->make_conv2d(d);
  HostTensor x(d.x_shape(), dtype, Layout::nhwc), y(d.y_shape(), dtype, Layout::nhwc);
  HostTensor dx(d.x_shape(), dtype, Layout::nhwc), dy(d.y_shape(), dtype, Layout::nhwc);
  HostTensor w(d.w_shape(), dtype), dw(d.w_shape(), DType::f32);
  for (HostTensor* t : {&x, &dy, &w}) fill(*t);
  std::memset(dw.view().data, 0, dw.view().bytes());
  for (auto _ : state) {
    switch (pass) {
      case Pass::forward:
        kernel->forward(y.view(), x.view(), w.view(), nullptr);
        break;
      case Pass::backward_data:
        kernel->backward_data(dx.view(), dy.view(), w.view());
        break;
      case Pass::backward_weights:
        kernel->backward_weights(dw.view(), nullptr, dy.view(), x.view());
        break;
    }
  }
  state.SetItemsProcessed(state.iterations() * d.macs());
  state.SetLabel(kernel->implementation());
}

}  // namespace

void register_conv() {
  for (const Pass pass : {Pass::forward, Pass::backward_data, Pass::backward_weights})
    for (const ConvShape& s : kConvs) {
      const std::string base = std::string("Conv/") + pass_name(pass) + "/" + s.name;
      benchmark::RegisterBenchmark((base + "/fp32/fp32").c_str(),
                                   [s, pass](benchmark::State& st) { run(st, s, pass, DType::f32, Arith::native); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      for (const Arith a : {Arith::native, Arith::fp32})
        benchmark::RegisterBenchmark((base + "/bf16/" + (a == Arith::native ? "native" : "fp32")).c_str(),
                                     [s, pass, a](benchmark::State& st) { run(st, s, pass, DType::bf16, a); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
}

}  // namespace rn

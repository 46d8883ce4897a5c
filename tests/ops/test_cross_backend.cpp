// The cross-backend op harness: every op of src/ops, run on the backend under test and on
// the reference backend (the oracle), compared output by output.
//
// One table of cases (cases()), each an op, its descriptor and its dtype. For each case the
// harness draws seeded random inputs rounded to the case dtype, runs forward and every
// backward on both backends (ref computes in fp32 on the same rounded values), and compares
// every output norm-wise, ||dut - ref|| / ||ref||, against the tolerance of the dtype the
// output is stored in (tolerance(), the one place tolerances live). Activation gradients and outputs are
// pre-filled with NaN, so an element a backend forgets to write fails; parameter gradients
// are pre-filled with random values and the increments (after - before) are compared, so
// overwriting instead of accumulating fails. Backward passes receive identical inputs (the
// reference forward's outputs), so a forward error is reported once, at the forward.
// A case a backend refuses (rn::Unsupported) is skipped visibly with the backend's message
// and counted in the summary printed at the end. RN_HARNESS_VERBOSE=1 prints every error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/rng.h"
#include "ops/backend.h"
#include "ops/staged_backend.h"

namespace rn {
namespace {

// ---------------------------------------------------------------------------------------
// Tolerances: the only place they are defined. They depend on the dtype an output is
// stored in, because inputs are identical (already rounded) on both sides and so the only
// legitimate differences are the backend's own roundings.
//
// fp32 outputs: both backends compute from identical inputs and differ only in summation
//   order (oneDNN: fp32 accumulation in blocked order; ref: fp64 or fp32 in loop order).
//   A sum of K random-signed terms then disagrees by about sqrt(K) * 2^-24 relative; our
//   largest reductions (K ~ 10^3, e.g. a 7x7x3 stem or BN over N*H*W) give ~2e-6, so 1e-5
//   has margin while a wrong index or a missing term shows up as 1e-3 or more. This holds
//   for the fp32 outputs of bf16 cases too (dw, db, dgamma, dbeta, saved and running stats:
//   products of bf16 values are exact in fp32), where we measured ~3e-7.
// bf16 outputs: the backend under test rounds each output to 8 significant bits (unit
//   roundoff u = 2^-9 = 1.95e-3, a strict bound on the norm-wise error of one rounding,
//   ~1.1e-3 typical), twice in the fused BN+add+ReLU (measured 2.4e-3). 5e-3 covers two
//   roundings with margin; the ~1e-2 one might guess would hide an n/(n-1)-sized bug.
// fp16 outputs: the same argument with u = 2^-11 (no CPU backend produces fp16 yet).
// Casts round to nearest even in every backend, so they must be exact.
double tolerance(DType output_dtype, bool exact_op) {
  if (exact_op) return 0.0;
  switch (output_dtype) {
    case DType::f32: return 1e-5;
    case DType::bf16: return 5e-3;
    case DType::f16: return 1.25e-3;
    default: return 0.0;
  }
}

// The backend under test: "cpu" in the CrossBackend suite, "cuda" in CrossBackendCuda
// (built with CUDA, run when a GPU is present). The harness works on host tensors; a device
// backend is wrapped by StagedBackend below, which copies every argument to the device and
// back around each call.
const char* kBackendUnderTest = "cpu";

// Where a backend stores an fp32 output through a narrower type, its tolerance is that
// type's. cuDNN's filter gradient has the filter's type, so the cuda backend's conv dw of a
// half case is rounded to the case dtype before it is added into the fp32 gradient (as
// PyTorch's autocast does).
DType conv_dw_rounding(DType case_dtype) { return std::string(kBackendUnderTest) == "cuda" ? case_dtype : DType::f32; }

// ---------------------------------------------------------------------------------------
// Cases. Each alternative of OpCase is one op (family and mode); std::visit below makes the
// compiler demand a runner for every alternative.

struct ConvCase {
  Conv2dDesc d;
};
struct BatchNormCase {
  BatchNormDesc d;
  bool training = true;  // forward_training + backward, else forward_inference
};
struct ReluCase {
  EltwiseDesc d;
};
struct AddCase {
  EltwiseDesc d;
};
struct CastCase {
  CastDesc d;
};
struct MaxPoolCase {
  MaxPoolDesc d;
};
struct GlobalAvgPoolCase {
  GlobalAvgPoolDesc d;
};
struct LinearCase {
  LinearDesc d;
};
struct LossCase {
  SoftmaxCrossEntropyDesc d;
};
struct CropFlipNormalizeCase {
  CropFlipNormalizeDesc d;
};
using OpCase = std::variant<ConvCase, BatchNormCase, ReluCase, AddCase, CastCase, MaxPoolCase, GlobalAvgPoolCase,
                            LinearCase, LossCase, CropFlipNormalizeCase>;
// A new op family means a new alternative, a runner and cases; this count is a reminder.
static_assert(std::variant_size_v<OpCase> == 10, "add the new op's runner and cases to the harness");

struct Case {
  std::string name;
  OpCase op;
  DType dtype = DType::f32;  // the case dtype: what the activations are stored in
  bool exact = false;        // conversions must match bit for bit
};

// gtest prints a failing parameter with this (instead of its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string dims_name(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }
std::string suffix(Layout l, DType t) {
  return std::string("_") + std::string(layout_name(l)) + "_" + std::string(dtype_name(t));
}

Case conv_case(Conv2dParams p, int64_t batch, int64_t h, int64_t w, Layout layout, DType dtype) {
  Conv2dDesc d;
  d.p = p;
  d.batch = batch, d.in_h = h, d.in_w = w, d.dtype = dtype, d.layout = layout;
  std::string name = "conv_k" + dims_name(p.kernel_h, p.kernel_w) + "_s" + dims_name(p.stride_h, p.stride_w) + "_p" +
                     dims_name(p.pad_h, p.pad_w) + "_d" + dims_name(p.dilation_h, p.dilation_w) + "_g" +
                     std::to_string(p.groups) + "_n" + std::to_string(batch) + "c" + std::to_string(p.in_channels) +
                     "k" + std::to_string(p.out_channels) + "_" + dims_name(h, w) + (p.bias ? "_bias" : "");
  return {name + suffix(layout, dtype), ConvCase{d}, dtype};
}

Conv2dParams conv(int64_t c, int64_t k, int64_t r, int64_t s, int64_t stride, int64_t pad, int64_t groups = 1,
                  bool bias = false, int64_t dilation = 1) {
  Conv2dParams p;
  p.in_channels = c, p.out_channels = k, p.kernel_h = r, p.kernel_w = s;
  p.stride_h = p.stride_w = stride, p.pad_h = p.pad_w = pad, p.dilation_h = p.dilation_w = dilation;
  p.groups = groups, p.bias = bias;
  return p;
}

// with_f32_outputs: half convolutions writing fp32 y and dx (or y only), for a backend that takes them
// (Backend::conv_f32_outputs(): cpu yes, cuda no).
std::vector<Case> cases(bool with_f16 = false, bool with_f32_outputs = true) {
  std::vector<Case> all;
  const Layout layouts[] = {Layout::nhwc, Layout::nchw};
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
  if (with_f16) dtypes.push_back(DType::f16);

  // conv2d: ResNet's shapes in miniature plus the odd ones.
  Conv2dParams rect = conv(8, 8, 1, 3, 1, 0);  // 1x3 kernel, stride 2x1, pad 0x2, dilation 1x2
  rect.stride_h = 2, rect.pad_w = 2, rect.dilation_w = 2;
  struct ConvShape {
    Conv2dParams p;
    int64_t n, h, w;
  };
  const ConvShape convs[] = {
      {conv(8, 16, 3, 3, 1, 1, 1, true), 2, 13, 13},     // 3x3 same, bias
      {conv(8, 8, 3, 3, 2, 1), 2, 7, 9},                 // 3x3 stride 2 on odd sizes
      {conv(16, 32, 1, 1, 1, 0), 2, 7, 7},               // bottleneck 1x1
      {conv(16, 32, 1, 1, 2, 0), 2, 13, 13},             // downsample 1x1 stride 2 (skipped pixels)
      {conv(3, 8, 7, 7, 2, 3), 1, 15, 15},               // 7x7 stem, batch 1, 3 channels
      {conv(16, 32, 1, 1, 1, 0, 4), 2, 9, 7},            // group-4 1x1
      {conv(16, 16, 3, 3, 2, 1, 4, true), 2, 13, 13},    // group-4 3x3 stride 2, bias
      {conv(16, 16, 3, 3, 1, 1, 16), 2, 13, 13},         // depthwise 3x3
      {conv(24, 24, 3, 3, 2, 1, 24, true), 2, 7, 9},     // depthwise 3x3 stride 2, bias
      {conv(8, 8, 3, 3, 1, 2, 1, false, 2), 2, 13, 13},  // dilation 2
      {rect, 2, 9, 11},                                  // rectangular, anisotropic everything
      // Full-width channel blocks, so oneDNN takes the kernels ResNet-50 itself runs.
      {conv(64, 64, 3, 3, 1, 1), 2, 14, 14},
      {conv(64, 128, 1, 1, 2, 0), 2, 14, 14},
      // Winograd on the cpu backend (3x3 stride 1, channels in 16-blocks and at least 64, 50M
      // multiply-accumulates or more): odd sizes (partial 4x4 output tiles), unequal channel
      // counts, a bias.
      {conv(64, 80, 3, 3, 1, 1, 1, true), 4, 17, 19},
  };
  for (DType t : dtypes)
    for (Layout l : layouts)
      for (const auto& c : convs) all.push_back(conv_case(c.p, c.n, c.h, c.w, l, t));
  // Half convolutions writing fp32 y and dx (precision O1's fused casts): held to fp32's bound.
  for (DType t : dtypes)
    if (with_f32_outputs && t != DType::f32)
      for (const auto& c : convs)
        for (const bool dx_too : {true, false}) {  // y only: where a batch norm writes x in half itself
          Case k = conv_case(c.p, c.n, c.h, c.w, Layout::nhwc, t);
          Conv2dDesc& d = std::get<ConvCase>(k.op).d;
          d.f32_y = true;
          d.f32_dx = dx_too;
          k.name += dx_too ? "_f32outputs" : "_f32y";
          all.push_back(std::move(k));
        }

  // batch_norm: every fuse mode, training and inference.
  struct BnShape {
    int64_t n, c, h, w;
  };
  const BnShape bns[] = {{2, 16, 7, 9}, {1, 8, 13, 13}};
  for (DType t : dtypes)
    for (Layout l : layouts)
      for (const auto& s : bns)
        for (BnFuse f : {BnFuse::none, BnFuse::relu, BnFuse::add_relu})
          for (bool training : {true, false}) {
            BatchNormDesc d;
            d.batch = s.n, d.channels = s.c, d.h = s.h, d.w = s.w, d.fuse = f, d.dtype = t, d.layout = l;
            d.momentum = 0.1f, d.eps = 1e-5f;
            const std::string name = std::string("bn_") + std::string(bn_fuse_name(f)) +
                                     (training ? "_train" : "_infer") + "_n" + std::to_string(s.n) + "c" +
                                     std::to_string(s.c) + "_" + dims_name(s.h, s.w);
            all.push_back({name + suffix(l, t), BatchNormCase{d, training}, t});
          }

  // Precision O1's fused casts around the convolutions: fp32 x (and residual), y and/or dx in
  // the half type, NHWC (BatchNormDesc::half_y, half_dx), for a backend that takes them.
  for (DType t : dtypes)
    if (with_f32_outputs && t != DType::f32)
      for (const auto& s : bns)
        for (BnFuse f : {BnFuse::none, BnFuse::relu, BnFuse::add_relu})
          for (const auto& [hy, hdx] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
            if (f == BnFuse::relu && hy != hdx) continue;  // refused: see BatchNormDesc
            for (bool training : {true, false}) {
              if (!training && (!hy || hdx)) continue;  // inference has no dx: y alone
              BatchNormDesc d;
              d.batch = s.n, d.channels = s.c, d.h = s.h, d.w = s.w, d.fuse = f, d.dtype = DType::f32;
              d.layout = Layout::nhwc, d.half = t, d.half_y = hy, d.half_dx = hdx;
              d.momentum = 0.1f, d.eps = 1e-5f;
              const std::string name = std::string("bn_") + std::string(bn_fuse_name(f)) +
                                       (training ? "_train" : "_infer") + "_n" + std::to_string(s.n) + "c" +
                                       std::to_string(s.c) + "_" + dims_name(s.h, s.w) + suffix(Layout::nhwc, t) +
                                       (hy ? "_halfy" : "") + (hdx ? "_halfdx" : "");
              all.push_back({name, BatchNormCase{d, training}, t});
            }
          }

  // pooling
  struct PoolShape {
    int64_t n, c, h, w, k, s, p;
  };
  const PoolShape pools[] = {{2, 16, 13, 13, 3, 2, 1}, {1, 8, 7, 9, 3, 2, 1}, {2, 8, 9, 9, 2, 2, 0}};
  for (DType t : dtypes)
    for (Layout l : layouts) {
      for (const auto& s : pools) {
        MaxPoolDesc d;
        d.batch = s.n, d.channels = s.c, d.in_h = s.h, d.in_w = s.w, d.kernel = s.k, d.stride = s.s, d.pad = s.p;
        d.dtype = t, d.layout = l;
        const std::string name = "maxpool_k" + std::to_string(s.k) + "_s" + std::to_string(s.s) + "_p" +
                                 std::to_string(s.p) + "_n" + std::to_string(s.n) + "c" + std::to_string(s.c) + "_" +
                                 dims_name(s.h, s.w);
        all.push_back({name + suffix(l, t), MaxPoolCase{d}, t});
      }
      for (const BnShape& s : {BnShape{2, 32, 7, 7}, BnShape{1, 16, 5, 3}}) {
        GlobalAvgPoolDesc d;
        d.batch = s.n, d.channels = s.c, d.h = s.h, d.w = s.w, d.dtype = t, d.layout = l;
        const std::string name = "gap_n" + std::to_string(s.n) + "c" + std::to_string(s.c) + "_" + dims_name(s.h, s.w);
        all.push_back({name + suffix(l, t), GlobalAvgPoolCase{d}, t});
      }
    }

  // Dense ops: layout does not apply.
  for (DType t : dtypes) {
    const std::string dt = "_" + std::string(dtype_name(t));
    for (const auto& [n, i, o, bias] :
         {std::tuple{4, 64, 10, true}, std::tuple{1, 33, 17, false}, std::tuple{2, 2048, 1000, true}}) {
      LinearDesc d;
      d.batch = n, d.in_features = i, d.out_features = o, d.bias = bias, d.dtype = t;
      all.push_back({"linear_n" + std::to_string(n) + "_in" + std::to_string(i) + "_out" + std::to_string(o) +
                         (bias ? "_bias" : "") + dt,
                     LinearCase{d}, t});
    }
    for (int64_t numel : {1000, 4099}) {
      EltwiseDesc d;
      d.numel = numel, d.dtype = t;
      all.push_back({"relu_" + std::to_string(numel) + dt, ReluCase{d}, t});
      all.push_back({"add_" + std::to_string(numel) + dt, AddCase{d}, t});
    }
  }
  for (const auto& [src, dst] :
       {std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::f16},
        std::pair{DType::f16, DType::f32}, std::pair{DType::bf16, DType::f16}}) {
    CastDesc d;
    d.numel = 1037, d.src = src, d.dst = dst;
    const DType half = src == DType::f32 ? dst : src;
    all.push_back({"cast_" + std::string(dtype_name(src)) + "_to_" + std::string(dtype_name(dst)), CastCase{d}, half,
                   /*exact=*/true});
  }
  // crop_flip_normalize: the same arithmetic everywhere, so every output must match exactly.
  for (DType t : dtypes)
    for (Layout l : layouts) {
      CropFlipNormalizeDesc d;
      d.batch = 4, d.channels = 3, d.src_h = 13, d.src_w = 11, d.out_h = 9, d.out_w = 10;
      d.mean = {0.485f, 0.456f, 0.406f}, d.std = {0.229f, 0.224f, 0.225f};
      d.dtype = t, d.layout = l;
      all.push_back({"crop_flip_normalize_n4_13x11_to_9x10" + suffix(l, t), CropFlipNormalizeCase{d}, t,
                     /*exact=*/true});
    }
  for (const auto& [n, k, smoothing] : {std::tuple{8, 10, 0.0f}, std::tuple{8, 10, 0.1f}, std::tuple{1, 1000, 0.1f}}) {
    SoftmaxCrossEntropyDesc d;
    d.batch = n, d.classes = k, d.label_smoothing = smoothing;
    all.push_back({"softmax_ce_n" + std::to_string(n) + "_k" + std::to_string(k) + (smoothing > 0 ? "_smooth" : ""),
                   LossCase{d}, DType::f32});
  }
  return all;
}

// ---------------------------------------------------------------------------------------
// Tensors given to both backends.

// One logical tensor for both backends: `ref` in fp32, `dut` in the case dtype, with the
// same (rounded) values.
struct Twin {
  HostTensor ref, dut;
};

Twin twin_of(const std::vector<float>& values, const Shape& shape, DType dtype, Layout layout = Layout::nchw) {
  Twin t{HostTensor(shape, DType::f32, layout), HostTensor(shape, dtype, layout)};
  float* r = t.ref.ptr<float>();
  for (size_t i = 0; i < values.size(); ++i) r[i] = round_to_dtype(values[i], dtype);
  convert(t.dut.view().data, dtype, r, DType::f32, values.size());
  return t;
}

std::vector<float> uniform(Rng& rng, int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

Twin random_twin(Rng& rng, const Shape& shape, DType dtype, Layout layout = Layout::nchw, float lo = -1.0f,
                 float hi = 1.0f) {
  return twin_of(uniform(rng, shape.numel(), lo, hi), shape, dtype, layout);
}

Twin nan_twin(const Shape& shape, DType dtype, Layout layout = Layout::nchw) {
  return twin_of(std::vector<float>(static_cast<size_t>(shape.numel()), std::numeric_limits<float>::quiet_NaN()), shape,
                 dtype, layout);
}

// A reference output handed to both backends as an input (rounded to the case dtype).
Twin twin_from_ref(const HostTensor& ref_out, DType dtype) {
  const Tensor& v = ref_out.view();
  std::vector<float> values(v.ptr<float>(), v.ptr<float>() + v.numel());
  return twin_of(values, v.shape, dtype, v.layout);
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(v.data(), DType::f32, t.data, t.dtype, v.size());
  return v;
}

// ---------------------------------------------------------------------------------------
// Comparison.

struct Compared {
  std::string output;
  DType dtype;  // what the output is stored in (decides the tolerance)
  std::vector<float> ref, dut;
};
using Results = std::vector<Compared>;

void compare(Results& out, const std::string& name, const Twin& t) {
  out.push_back({name, t.dut.view().dtype, as_f32(t.ref.view()), as_f32(t.dut.view())});
}

// For an accumulated parameter gradient: compares the increments after - before.
void compare_increment(Results& out, const std::string& name, const Twin& t, const std::vector<float>& before,
                       DType rounded_to = DType::f32) {
  Compared c{name + "(+=)", rounded_to, as_f32(t.ref.view()), as_f32(t.dut.view())};
  for (size_t i = 0; i < before.size(); ++i) c.ref[i] -= before[i], c.dut[i] -= before[i];
  out.push_back(std::move(c));
}

struct Mismatch {
  double relative = 0.0;  // ||dut - ref|| / ||ref||; NaN if either has a NaN
  double max_abs = 0.0;
  size_t worst = 0;
};

Mismatch relative_error(const Compared& c) {
  Mismatch e;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < c.ref.size(); ++i) {
    const double d = static_cast<double>(c.dut[i]) - c.ref[i];
    diff += d * d;
    norm += static_cast<double>(c.ref[i]) * c.ref[i];
    if (!(std::fabs(d) <= e.max_abs)) e.max_abs = std::fabs(d), e.worst = i;
  }
  e.relative = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  if (std::isnan(diff) || std::isnan(norm)) e.relative = std::numeric_limits<double>::quiet_NaN();
  return e;
}

// ---------------------------------------------------------------------------------------
// Runners: one per op, each running the case on `ref` and on `dut`.

struct Backends {
  Backend& ref;
  Backend& dut;
};

void run(const ConvCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const Conv2dDesc& d = c.d;
  Conv2dDesc rd = d;
  rd.dtype = DType::f32;
  rd.f32_y = rd.f32_dx = false;
  auto kr = b.ref.make_conv2d(rd);
  auto kd = b.dut.make_conv2d(d);

  Twin x = random_twin(rng, d.x_shape(), t, d.layout), w = random_twin(rng, d.w_shape(), t);
  Twin bias = random_twin(rng, {d.p.out_channels}, DType::f32);
  Twin y = nan_twin(d.y_shape(), d.y_dtype(), d.layout);
  const Tensor* br = d.p.bias ? &bias.ref.view() : nullptr;
  const Tensor* bd = d.p.bias ? &bias.dut.view() : nullptr;
  kr->forward(y.ref, x.ref, w.ref, br);
  kd->forward(y.dut, x.dut, w.dut, bd);
  compare(out, "y", y);

  Twin dy = random_twin(rng, d.y_shape(), t, d.layout), dx = nan_twin(d.x_shape(), d.dx_dtype(), d.layout);
  kr->backward_data(dx.ref, dy.ref, w.ref);
  kd->backward_data(dx.dut, dy.dut, w.dut);
  compare(out, "dx", dx);

  const auto dw0 = uniform(rng, d.w_shape().numel(), -1, 1), db0 = uniform(rng, d.p.out_channels, -1, 1);
  Twin dw = twin_of(dw0, d.w_shape(), DType::f32), db = twin_of(db0, {d.p.out_channels}, DType::f32);
  kr->backward_weights(dw.ref, d.p.bias ? &db.ref.view() : nullptr, dy.ref, x.ref);
  kd->backward_weights(dw.dut, d.p.bias ? &db.dut.view() : nullptr, dy.dut, x.dut);
  compare_increment(out, "dw", dw, dw0, conv_dw_rounding(t));
  if (d.p.bias) compare_increment(out, "db", db, db0);
}

void run(const BatchNormCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const BatchNormDesc& d = c.d;
  BatchNormDesc rd = d;
  rd.dtype = DType::f32;
  rd.half_y = rd.half_dx = false;
  auto kr = b.ref.make_batch_norm(rd);
  auto kd = b.dut.make_batch_norm(d);
  const Shape xs = d.x_shape(), cs = {d.channels};
  const bool add = d.fuse == BnFuse::add_relu;
  // x and the residual in d.dtype; y, dy in d.y_dtype(); dx in d.dx_dtype() (all t but in
  // the mixed cases of precision O1).
  const DType xt = d.dtype, yt = d.y_dtype(), dxt = d.dx_dtype();
  (void)t;

  // Channels with a non-zero mean and a spread unlike 1, as after a convolution.
  Twin x = random_twin(rng, xs, xt, d.layout, -1.5f, 2.5f);
  Twin residual = random_twin(rng, xs, xt, d.layout);
  Twin gamma = random_twin(rng, cs, DType::f32, Layout::nchw, 0.5f, 1.5f);
  Twin beta = random_twin(rng, cs, DType::f32, Layout::nchw, -0.5f, 0.5f);
  Twin rmean = random_twin(rng, cs, DType::f32, Layout::nchw, -0.5f, 0.5f);
  Twin rvar = random_twin(rng, cs, DType::f32, Layout::nchw, 0.5f, 2.0f);
  Twin y = nan_twin(xs, yt, d.layout);
  const Tensor* rr = add ? &residual.ref.view() : nullptr;
  const Tensor* rdut = add ? &residual.dut.view() : nullptr;

  if (!c.training) {
    kr->forward_inference(y.ref, x.ref, rr, gamma.ref, beta.ref, rmean.ref, rvar.ref);
    kd->forward_inference(y.dut, x.dut, rdut, gamma.dut, beta.dut, rmean.dut, rvar.dut);
    compare(out, "y", y);
    return;
  }
  Twin mean = nan_twin(cs, DType::f32), invstd = nan_twin(cs, DType::f32);
  kr->forward_training(y.ref, mean.ref, invstd.ref, x.ref, rr, gamma.ref, beta.ref, rmean.ref, rvar.ref);
  kd->forward_training(y.dut, mean.dut, invstd.dut, x.dut, rdut, gamma.dut, beta.dut, rmean.dut, rvar.dut);
  compare(out, "y", y);
  compare(out, "saved_mean", mean);
  compare(out, "saved_invstd", invstd);
  compare(out, "running_mean", rmean);
  compare(out, "running_var", rvar);

  // Recompute (memory level O2): each backend rebuilds its own y bit for bit from its own
  // saved statistics and leaves the running statistics alone.
  auto bytes_of = [](const HostTensor& h) {
    const char* p = static_cast<const char*>(h.view().data);
    return std::vector<char>(p, p + h.view().bytes());
  };
  const std::vector<std::vector<char>> running_before = {bytes_of(rmean.ref), bytes_of(rvar.ref), bytes_of(rmean.dut),
                                                         bytes_of(rvar.dut)};
  Twin y_again = nan_twin(xs, yt, d.layout);
  kr->forward_recompute(y_again.ref, x.ref, rr, gamma.ref, beta.ref, mean.ref, invstd.ref);
  kd->forward_recompute(y_again.dut, x.dut, rdut, gamma.dut, beta.dut, mean.dut, invstd.dut);
  EXPECT_EQ(bytes_of(y_again.ref), bytes_of(y.ref)) << d.str() << ": ref's recomputed y differs from its forward y";
  EXPECT_EQ(bytes_of(y_again.dut), bytes_of(y.dut))
      << d.str() << ": " << kBackendUnderTest << "'s recomputed y differs from its forward y";
  const std::vector<std::vector<char>> running_after = {bytes_of(rmean.ref), bytes_of(rvar.ref), bytes_of(rmean.dut),
                                                        bytes_of(rvar.dut)};
  EXPECT_TRUE(running_before == running_after) << d.str() << ": recompute changed the running statistics";
  // Recomputing from another input is caught, not silently wrong.
  const float x0 = x.ref.ptr<float>()[0];
  x.ref.ptr<float>()[0] = x0 + 1.0f;
  EXPECT_THROW(kr->forward_recompute(y_again.ref, x.ref, rr, gamma.ref, beta.ref, mean.ref, invstd.ref), Error);
  x.ref.ptr<float>()[0] = x0;

  // Backward on identical inputs: the reference's y and saved statistics.
  Twin y_in = twin_from_ref(y.ref, yt), mean_in = twin_from_ref(mean.ref, DType::f32),
       invstd_in = twin_from_ref(invstd.ref, DType::f32);
  Twin dy = random_twin(rng, xs, yt, d.layout), dx = nan_twin(xs, dxt, d.layout), dres = nan_twin(xs, xt, d.layout);
  const auto dg0 = uniform(rng, d.channels, -1, 1), db0 = uniform(rng, d.channels, -1, 1);
  Twin dgamma = twin_of(dg0, cs, DType::f32), dbeta = twin_of(db0, cs, DType::f32);
  kr->backward(dx.ref, add ? &dres.ref.view() : nullptr, dgamma.ref, dbeta.ref, dy.ref, x.ref, y_in.ref, gamma.ref,
               mean_in.ref, invstd_in.ref);
  kd->backward(dx.dut, add ? &dres.dut.view() : nullptr, dgamma.dut, dbeta.dut, dy.dut, x.dut, y_in.dut, gamma.dut,
               mean_in.dut, invstd_in.dut);
  compare(out, "dx", dx);
  if (add) compare(out, "dresidual", dres);
  compare_increment(out, "dgamma", dgamma, dg0);
  compare_increment(out, "dbeta", dbeta, db0);

  // In place (memory levels O1/O2 write dx over dy): the same dx, bit for bit, on each backend.
  if (dxt != yt) return;  // not in place then
  Twin inplace = twin_from_ref(dy.ref, yt);
  std::memcpy(inplace.dut.view().data, dy.dut.view().data, dy.dut.view().bytes());
  Twin dres2 = nan_twin(xs, xt, d.layout);
  kr->backward(inplace.ref, add ? &dres2.ref.view() : nullptr, dgamma.ref, dbeta.ref, inplace.ref, x.ref, y_in.ref,
               gamma.ref, mean_in.ref, invstd_in.ref);
  kd->backward(inplace.dut, add ? &dres2.dut.view() : nullptr, dgamma.dut, dbeta.dut, inplace.dut, x.dut, y_in.dut,
               gamma.dut, mean_in.dut, invstd_in.dut);
  EXPECT_EQ(bytes_of(inplace.ref), bytes_of(dx.ref)) << d.str() << ": ref's in-place dx differs";
  EXPECT_EQ(bytes_of(inplace.dut), bytes_of(dx.dut))
      << d.str() << ": " << kBackendUnderTest << "'s in-place dx differs";
}

void run(const ReluCase& c, DType t, Backends b, Rng& rng, Results& out) {
  EltwiseDesc rd = c.d;
  rd.dtype = DType::f32;
  auto kr = b.ref.make_relu(rd);
  auto kd = b.dut.make_relu(c.d);
  const Shape s = {c.d.numel};
  Twin x = random_twin(rng, s, t), y = nan_twin(s, t);
  kr->forward(y.ref, x.ref);
  kd->forward(y.dut, x.dut);
  compare(out, "y", y);
  Twin y_in = twin_from_ref(y.ref, t), dy = random_twin(rng, s, t), dx = nan_twin(s, t);
  kr->backward(dx.ref, dy.ref, y_in.ref);
  kd->backward(dx.dut, dy.dut, y_in.dut);
  compare(out, "dx", dx);
}

void run(const AddCase& c, DType t, Backends b, Rng& rng, Results& out) {
  EltwiseDesc rd = c.d;
  rd.dtype = DType::f32;
  auto kr = b.ref.make_add(rd);
  auto kd = b.dut.make_add(c.d);
  const Shape s = {c.d.numel};
  Twin a = random_twin(rng, s, t), bb = random_twin(rng, s, t), y = nan_twin(s, t);
  kr->forward(y.ref, a.ref, bb.ref);
  kd->forward(y.dut, a.dut, bb.dut);
  compare(out, "y", y);
}

// Casts run in the same dtypes on both backends (the reference converts with core/dtype.h).
void run(const CastCase& c, DType, Backends b, Rng& rng, Results& out) {
  auto kr = b.ref.make_cast(c.d);
  auto kd = b.dut.make_cast(c.d);
  const Shape s = {c.d.numel};
  // Magnitudes over many binades, so that rounding, not just truncation, is exercised.
  std::vector<float> v = uniform(rng, c.d.numel, -1, 1);
  for (auto& e : v) e *= std::ldexp(1.0f, static_cast<int>(rng.below(24)) - 12);
  HostTensor x(s, c.d.src), yr(s, c.d.dst), yd(s, c.d.dst);
  convert(x.view().data, c.d.src, v.data(), DType::f32, v.size());
  kr->forward(yr, x);
  kd->forward(yd, x);
  out.push_back({"y", c.d.dst, as_f32(yr.view()), as_f32(yd.view())});
}

// Max pooling inputs are distinct within each plane (exact in bf16 too), so that the
// argmax, and with it the backward, is unique.
std::vector<float> distinct_planes(Rng& rng, int64_t planes, int64_t plane_size) {
  std::vector<float> pool;
  for (int e = -4; e < 4; ++e)
    for (int m = 0; m < 128; ++m)
      for (float sign : {1.0f, -1.0f}) pool.push_back(sign * std::ldexp(1.0f + m / 128.0f, e));
  RN_CHECK(plane_size <= static_cast<int64_t>(pool.size())) << "plane too large for distinct values";
  std::vector<float> v;
  for (int64_t p = 0; p < planes; ++p) {
    for (size_t i = pool.size() - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
    v.insert(v.end(), pool.begin(), pool.begin() + plane_size);
  }
  return v;
}

// Permutes values given in logical NCHW order into `layout`.
std::vector<float> to_layout(const std::vector<float>& nchw, const Shape& s, Layout layout) {
  if (layout == Layout::nchw) return nchw;
  Tensor t;
  t.shape = s, t.layout = layout;
  std::vector<float> v(nchw.size());
  size_t i = 0;
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < s[1]; ++c)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t w = 0; w < s[3]; ++w) v[static_cast<size_t>(t.offset(n, c, h, w))] = nchw[i++];
  return v;
}

void run(const MaxPoolCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const MaxPoolDesc& d = c.d;
  MaxPoolDesc rd = d;
  rd.dtype = DType::f32;
  auto kr = b.ref.make_max_pool(rd);
  auto kd = b.dut.make_max_pool(d);
  const Shape xs = d.x_shape(), ys = d.y_shape();
  const auto values = distinct_planes(rng, d.batch * d.channels, d.in_h * d.in_w);
  Twin x = twin_of(to_layout(values, xs, d.layout), xs, t, d.layout), y = nan_twin(ys, t, d.layout);
  // Each backend keeps its own workspace (its encoding is backend-defined).
  HostTensor wr({static_cast<int64_t>(kr->workspace_bytes())}, DType::u8);
  HostTensor wd({static_cast<int64_t>(kd->workspace_bytes())}, DType::u8);
  kr->forward(y.ref, wr, x.ref);
  kd->forward(y.dut, wd, x.dut);
  compare(out, "y", y);
  Twin dy = random_twin(rng, ys, t, d.layout), dx = nan_twin(xs, t, d.layout);
  kr->backward(dx.ref, dy.ref, wr);
  kd->backward(dx.dut, dy.dut, wd);
  compare(out, "dx", dx);
}

void run(const GlobalAvgPoolCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const GlobalAvgPoolDesc& d = c.d;
  GlobalAvgPoolDesc rd = d;
  rd.dtype = DType::f32;
  auto kr = b.ref.make_global_avg_pool(rd);
  auto kd = b.dut.make_global_avg_pool(d);
  Twin x = random_twin(rng, d.x_shape(), t, d.layout), y = nan_twin(d.y_shape(), t);
  kr->forward(y.ref, x.ref);
  kd->forward(y.dut, x.dut);
  compare(out, "y", y);
  Twin dy = random_twin(rng, d.y_shape(), t), dx = nan_twin(d.x_shape(), t, d.layout);
  kr->backward(dx.ref, dy.ref);
  kd->backward(dx.dut, dy.dut);
  compare(out, "dx", dx);
}

void run(const LinearCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const LinearDesc& d = c.d;
  LinearDesc rd = d;
  rd.dtype = DType::f32;
  auto kr = b.ref.make_linear(rd);
  auto kd = b.dut.make_linear(d);
  Twin x = random_twin(rng, d.x_shape(), t), w = random_twin(rng, d.w_shape(), t);
  Twin bias = random_twin(rng, {d.out_features}, DType::f32), y = nan_twin(d.y_shape(), t);
  kr->forward(y.ref, x.ref, w.ref, d.bias ? &bias.ref.view() : nullptr);
  kd->forward(y.dut, x.dut, w.dut, d.bias ? &bias.dut.view() : nullptr);
  compare(out, "y", y);
  Twin dy = random_twin(rng, d.y_shape(), t), dx = nan_twin(d.x_shape(), t);
  kr->backward_data(dx.ref, dy.ref, w.ref);
  kd->backward_data(dx.dut, dy.dut, w.dut);
  compare(out, "dx", dx);
  const auto dw0 = uniform(rng, d.w_shape().numel(), -1, 1), db0 = uniform(rng, d.out_features, -1, 1);
  Twin dw = twin_of(dw0, d.w_shape(), DType::f32), db = twin_of(db0, {d.out_features}, DType::f32);
  kr->backward_weights(dw.ref, d.bias ? &db.ref.view() : nullptr, dy.ref, x.ref);
  kd->backward_weights(dw.dut, d.bias ? &db.dut.view() : nullptr, dy.dut, x.dut);
  compare_increment(out, "dw", dw, dw0);
  if (d.bias) compare_increment(out, "db", db, db0);
}

void run(const LossCase& c, DType, Backends b, Rng& rng, Results& out) {
  const SoftmaxCrossEntropyDesc& d = c.d;
  auto kr = b.ref.make_softmax_cross_entropy(d);
  auto kd = b.dut.make_softmax_cross_entropy(d);
  const Shape nk = {d.batch, d.classes};
  Twin logits = random_twin(rng, nk, DType::f32, Layout::nchw, -4.0f, 4.0f);
  HostTensor labels({d.batch}, DType::i32);
  for (int64_t n = 0; n < d.batch; ++n) labels.ptr<int32_t>()[n] = static_cast<int32_t>(rng.below(d.classes));
  Twin loss = nan_twin({1}, DType::f32), probs = nan_twin(nk, DType::f32);
  kr->forward(loss.ref, probs.ref, logits.ref, labels);
  kd->forward(loss.dut, probs.dut, logits.dut, labels);
  compare(out, "loss", loss);
  compare(out, "probs", probs);
  Twin probs_in = twin_from_ref(probs.ref, DType::f32), dlogits = nan_twin(nk, DType::f32);
  const float grad_scale = 128.0f;  // a typical loss scale
  kr->backward(dlogits.ref, probs_in.ref, labels, grad_scale);
  kd->backward(dlogits.dut, probs_in.dut, labels, grad_scale);
  compare(out, "dlogits", dlogits);
}

// Random pixels; crops inside, overlapping the border (zero padding) and flipped.
void run(const CropFlipNormalizeCase& c, DType t, Backends b, Rng& rng, Results& out) {
  const CropFlipNormalizeDesc& d = c.d;
  auto kr = b.ref.make_crop_flip_normalize(d);
  auto kd = b.dut.make_crop_flip_normalize(d);
  HostTensor x({d.x_shape().numel()}, DType::u8), crops({d.batch, 3}, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
  const int32_t placements[4][3] = {{0, 0, 0}, {2, 1, 1}, {-2, 3, 0}, {5, -1, 1}};
  for (int64_t n = 0; n < d.batch; ++n)
    for (int k = 0; k < 3; ++k) crops.ptr<int32_t>()[n * 3 + k] = placements[n % 4][k];
  Twin y = nan_twin(d.y_shape(), t, d.layout);
  HostTensor yr(d.y_shape(), t, d.layout);
  kr->forward(yr, x, crops);
  kd->forward(y.dut, x, crops);
  out.push_back({"y", t, as_f32(yr.view()), as_f32(y.dut.view())});
}

// ---------------------------------------------------------------------------------------
// Summary, printed once after all cases.

struct Summary {
  struct Worst {
    double error = -1.0, tolerance = 0.0;
    std::string where;
  };
  int passed = 0, failed = 0, unsupported = 0;
  std::map<std::string, Worst> worst;  // "<case dtype> case, <output dtype> outputs" -> worst
  std::vector<std::string> unsupported_cases;

  static Summary& get(const std::string& backend = kBackendUnderTest) {
    static std::map<std::string, Summary> all;
    return all[backend];
  }
  static std::vector<std::string> backends_run() {
    std::vector<std::string> names;
    for (const char* n : {"cpu", "cuda"})
      if (get(n).passed + get(n).failed + get(n).unsupported > 0) names.push_back(n);
    return names;
  }
  void note_error(DType case_dtype, DType output_dtype, double err, double tol, const std::string& where) {
    const std::string key =
        std::string(dtype_name(case_dtype)) + " cases, " + std::string(dtype_name(output_dtype)) + " outputs";
    Worst& w = worst[key];
    if (std::isnan(err) || err > w.error) w = {err, tol, where};
  }
};

class SummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& name : Summary::backends_run()) print(name, Summary::get(name));
  }
  static void print(const std::string& name, const Summary& s) {
    std::printf("\n[cross-backend] %s vs ref: %d passed, %d failed, %d unsupported\n", name.c_str(), s.passed, s.failed,
                s.unsupported);
    for (const auto& [key, w] : s.worst)
      std::printf("[cross-backend] worst relative error, %s: %.3g (tolerance %.3g) in %s\n", key.c_str(), w.error,
                  w.tolerance, w.where.c_str());
    for (const auto& u : s.unsupported_cases) std::printf("[cross-backend] unsupported: %s\n", u.c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const kSummary = ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

// ---------------------------------------------------------------------------------------
// The parameterised test.

Backend& backend(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Backend>> made;
  auto& b = made[name];
  if (!b) {
    b = make_backend(name);
    if (b->device() != Device::cpu) b = make_staged_backend(std::move(b));
  }
  return *b;
}

uint64_t seed_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a case's inputs do not depend on the others
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

class CrossBackend : public ::testing::TestWithParam<Case> {};

void run_case(const Case& c);

TEST_P(CrossBackend, MatchesReference) {
  kBackendUnderTest = "cpu";
  run_case(GetParam());
}

// The cuda backend: every case, fp16 too, when this build has it and a GPU is present.
class CrossBackendCuda : public ::testing::TestWithParam<Case> {};

TEST_P(CrossBackendCuda, MatchesReference) {
  std::string why;
  if (!cuda_usable(&why)) GTEST_SKIP() << "cuda backend not run: " << why;
  kBackendUnderTest = "cuda";
  run_case(GetParam());
}

void run_case(const Case& c) {
  Results results;
  Rng rng(seed_of(c.name));
  try {
    std::visit(
        [&](const auto& op) {
          run(op, c.dtype, Backends{backend("ref"), backend(kBackendUnderTest)}, rng, results);
        },
        c.op);
  } catch (const Unsupported& e) {
    Summary::get().unsupported++;
    Summary::get().unsupported_cases.push_back(c.name + ": " + e.what());
    GTEST_SKIP() << "unsupported: " << e.what();
  } catch (const std::exception& e) {
    Summary::get().failed++;
    FAIL() << c.name << ": " << e.what();
  }
  const bool verbose = std::getenv("RN_HARNESS_VERBOSE") != nullptr;
  bool ok = true;
  for (const Compared& out : results) {
    const double tol = tolerance(out.dtype, c.exact);
    const Mismatch e = relative_error(out);
    const bool pass = e.relative <= tol;  // false for NaN
    ok = ok && pass;
    if (!c.exact) Summary::get().note_error(c.dtype, out.dtype, e.relative, tol, c.name + "/" + out.output);
    if (verbose)
      std::printf("[cross-backend] %s/%s: %.3g (tolerance %.3g)\n", c.name.c_str(), out.output.c_str(), e.relative,
                  tol);
    EXPECT_TRUE(pass) << c.name << ": output " << out.output << " differs from ref: relative error " << e.relative
                      << " > " << tol << "; worst element " << e.worst << ": " << kBackendUnderTest << " "
                      << out.dut[e.worst] << " vs ref " << out.ref[e.worst] << " (" << out.ref.size() << " elements)";
  }
  (ok ? Summary::get().passed : Summary::get().failed)++;
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossBackend, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Ops, CrossBackendCuda,
                         ::testing::ValuesIn(cases(/*with_f16=*/true, /*with_f32_outputs=*/false)),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------
// Sizes past int64: refused with the sizes named, never wrapped (a wrong plan) or handed to a
// library (oneDNN died of SIGFPE on such a convolution).

// The message of the rn::Error that `f` throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no rn::Error thrown";
  return {};
}

TEST(SizeLimits, ShapesPastInt64AreRefusedNamingTheShape) {
  const int64_t big = int64_t{1} << 32;
  const Shape wraps = {big, 1, 65536, 65536};  // 2^64 elements
  EXPECT_NE(error_of([&] { (void)wraps.numel(); }).find(wraps.str()), std::string::npos);
  // The elements fit, their bytes do not.
  const Shape elements_fit = {int64_t{1} << 31, int64_t{1} << 31};
  EXPECT_GT(elements_fit.numel(), 0);
  EXPECT_FALSE(shape_bytes_fit(elements_fit, DType::f32));
  EXPECT_TRUE(shape_bytes_fit(elements_fit, DType::u8));
  EXPECT_NE(error_of([&] { (void)shape_bytes(elements_fit, DType::f32); }).find(elements_fit.str()), std::string::npos);
  Tensor t;
  t.shape = wraps;
  EXPECT_THROW((void)t.bytes(), Error);
}

TEST(SizeLimits, DescriptorsRefuseTensorsPastInt64) {
  // A convolution whose input fits and whose output (16 times as many channels) does not.
  Conv2dDesc conv;
  conv.p.in_channels = 1, conv.p.out_channels = 16;
  conv.p.kernel_h = conv.p.kernel_w = 3, conv.p.pad_h = conv.p.pad_w = 1;
  conv.batch = int64_t{1} << 28, conv.in_h = conv.in_w = 65536;
  ASSERT_TRUE(shape_bytes_fit(conv.x_shape(), conv.dtype));
  const std::string m = error_of([&] { conv.validate(); });
  EXPECT_NE(m.find("conv2d"), std::string::npos) << m;
  EXPECT_NE(m.find("N=" + std::to_string(conv.batch)), std::string::npos) << m;
  // The cpu backend refuses it before oneDNN sees it.
  EXPECT_THROW(make_backend("cpu")->make_conv2d(conv), Error);
  conv.batch = 1;
  EXPECT_NO_THROW(conv.validate());

  MaxPoolDesc pool;
  pool.batch = int64_t{1} << 32, pool.channels = 1, pool.in_h = pool.in_w = 65536;
  EXPECT_NE(error_of([&] { pool.validate(); }).find("max_pool"), std::string::npos);
  GlobalAvgPoolDesc gap;
  gap.batch = int64_t{1} << 32, gap.channels = 1, gap.h = gap.w = 65536;
  EXPECT_NE(error_of([&] { gap.validate(); }).find("global_avg_pool"), std::string::npos);
  BatchNormDesc bn;
  bn.batch = int64_t{1} << 32, bn.channels = 1, bn.h = bn.w = 65536;
  EXPECT_NE(error_of([&] { bn.validate(); }).find("batch_norm"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// The CPU backend's dtype policy.

TEST(CpuBackendPolicy, NameLayoutAndDtypes) {
  auto cpu = make_backend("cpu");
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(cpu->preferred_layout(), Layout::nhwc);
  std::string why;
  EXPECT_TRUE(cpu->supports_dtype(DType::f32, &why));
  EXPECT_FALSE(cpu->supports_dtype(DType::f16, &why));
  EXPECT_NE(why.find("fp16"), std::string::npos) << why;
  Conv2dDesc d;
  d.p.in_channels = d.p.out_channels = 4, d.dtype = DType::f16;
  try {
    cpu->make_conv2d(d);
    ADD_FAILURE() << "fp16 conv2d was accepted";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
  std::string bf16_why;
  EXPECT_EQ(cpu->supports_dtype(DType::bf16, nullptr), cpu_has_native_bf16(&bf16_why)) << bf16_why;
}

// Without native bf16 (simulated by capping oneDNN's ISA below avx512_bf16, which must
// happen before oneDNN's first use, hence in a fresh process), bf16 is refused with a
// message naming what is missing, never run emulated. Exit code 0 means refused correctly.
[[noreturn]] void bf16_refusal_child() {
  setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE", 1);
  auto cpu = make_backend("cpu");
  std::string why;
  if (cpu->supports_dtype(DType::bf16, &why)) std::exit(2);
  Conv2dDesc d;
  d.p.in_channels = d.p.out_channels = 4;
  d.dtype = DType::bf16;
  try {
    cpu->make_conv2d(d);
  } catch (const Unsupported& e) {
    const std::string m = e.what();
    std::fprintf(stderr, "%s\n", m.c_str());
    const bool names_isa = m.find("avx512_bf16") != std::string::npos;
    const bool suggests_fp32 = m.find("fp32") != std::string::npos;
    std::exit(names_isa && suggests_fp32 ? 0 : 3);
  }
  std::exit(4);
}

TEST(CpuBackendPolicy, RefusesBf16WithoutNativeSupport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(bf16_refusal_child(), ::testing::ExitedWithCode(0), "avx512_bf16");
}

}  // namespace
}  // namespace rn

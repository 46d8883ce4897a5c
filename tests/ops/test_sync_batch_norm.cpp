// Synchronised batch norm (BatchNormKernel::set_stats_reducer) on the ref, cpu and cuda
// backends (cuda: through the staged backend, which hands the kernel a device reducer whose
// sums cross to the simulated ranks on the host; skipped visibly without a GPU).
//
// W simulated ranks (tests/simulated_ranks.h), each with its own kernel on its slice of a
// batch of W*B, must reproduce one kernel of the same backend on the whole batch without a
// reducer: y, saved and running statistics, dx and dresidual slice by slice, and the sum
// over ranks of the dgamma/dbeta increments (each rank keeps its local contribution; the
// gradient all-reduce adds them). W = 1 with a reducer must equal no reducer. Each rank's
// forward_recompute must rewrite its y bit for bit without calling the reducer, and
// forward_training and backward must call it exactly once each. RN_SYNC_PRINT=1 prints
// every measured error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/backend.h"
#include "simulated_ranks.h"
#include "staged_backend.h"

namespace rn::testing {
namespace {

// Norm-wise relative error bounds, ||ranks - whole|| / ||whole||, per compared quantity.
// The two sides differ in how they compute the statistics (ranks: one pass of fp64 sum x
// and sum x^2 over all ranks, var = Q/M - mean^2, normalised with the fp32-rounded saved
// statistics; whole batch: the backend's own kernel) and in summation order, never in what
// they compute, so an error in a count (M vs M_k, n/(n-1)) or a missing rank's sum shows up
// at 1e-2 or more.
struct Tolerance {
  double activations;  // y, dx, dresidual (stored in the case dtype)
  double statistics;   // saved mean/invstd, running mean/var (fp32)
  double param_grads;  // summed dgamma, dbeta (fp32)
};
Tolerance tolerance(const std::string& backend, DType dtype) {
  // ref: fp64 sums on both sides; the outputs differ by the final fp32 rounding and by
  //   normalising with the fp32-rounded statistics (a relative 6e-8 each): 1e-6 has margin.
  if (backend == "ref") return {1e-6, 1e-6, 1e-6};
  // cpu fp32: the whole batch runs oneDNN in NCHW (fp32 accumulation in blocked order over
  //   M = 90 values, ~sqrt(M) * 6e-8 ~ 1e-6) and the backend's NHWC loops in NHWC (fp32
  //   sums over chunks of pixels, fp64 across them), the ranks fp32 element arithmetic with
  //   fp64 sums.
  //   Measured below 2e-7; 1e-5 is the cross-backend harness's fp32 bound.
  // cuda (fp32, and the statistics of bf16/fp16 below): the whole batch's statistics are
  //   one-pass fp32 Welford runs merged in double, the ranks' fp32 block sums merged in
  //   double; both within a few 1e-7 (emulated), so the same bounds hold.
  if (dtype == DType::f32) return {1e-5, 1e-5, 1e-5};
  // cpu bf16: inputs are the same bf16 values on both sides, so the fp32 statistics and
  //   parameter gradients stay as tight as fp32 (products of bf16 values are exact in fp32).
  //   Activations are rounded to 8 significant bits (u = 2^-9 = 2e-3) once by the ranks and
  //   once or, for add_relu in NCHW (oneDNN rounds bn(x) and then bn(x) + residual), twice
  //   by the whole batch: 5e-3, the harness's bf16 bound. dx and dresidual are rounded once on
  //   each side (their inputs are identical; see below).
  return {5e-3, 1e-5, 1e-5};
}
// Backward inputs: the ranks' backward reads the whole batch's y (for the ReLU mask), as the
// cross-backend harness does, so that a forward difference is reported once, at the forward.
// With the rank's own y, bf16 add_relu fails legitimately in NCHW: oneDNN rounds bn(x) to
// bf16 before adding the residual, the ranks add in fp32, and where bn(x) ~ -residual the two z
// can differ in sign (measured: 3 of 540 elements), flipping O(1) mask entries of dresidual
// and dx. (The plan test runs the ranks end to end on their own outputs.)

// The default shape per rank: batch B (the whole batch is ranks * B), odd H*W and a channel
// count that is not a multiple of a vector width.
constexpr int64_t kB = 2, kC = 6, kH = 3, kW = 5;

struct SyncCase {
  std::string backend;
  DType dtype;
  Layout layout;
  BnFuse fuse;
  int ranks;
  int64_t b = kB, channels = kC, h = kH, w = kW;  // per rank
};

std::string case_text(const SyncCase& c) {
  return c.backend + "_" + std::string(dtype_name(c.dtype)) + "_" + std::string(layout_name(c.layout)) + "_" +
         std::string(bn_fuse_name(c.fuse)) + "_w" + std::to_string(c.ranks) +
         (c.channels == kC ? "" : "_c" + std::to_string(c.channels));
}
std::string case_name(const ::testing::TestParamInfo<SyncCase>& info) { return case_text(info.param); }
// How GoogleTest shows a failing case's parameter.
void PrintTo(const SyncCase& c, std::ostream* os) { *os << case_text(c); }

BatchNormDesc desc_for(const SyncCase& c, int64_t batch) {
  BatchNormDesc d;
  d.batch = batch, d.channels = c.channels, d.h = c.h, d.w = c.w, d.fuse = c.fuse, d.dtype = c.dtype,
  d.layout = c.layout;
  d.momentum = 0.25f, d.eps = 1e-5f;
  return d;
}

// The backend of a case; cuda staged (host tensors in and out), null with the reason when
// this machine cannot run it.
std::unique_ptr<Backend> backend_for(const std::string& name, std::string* why) {
  if (name != "cuda") return make_backend(name);
  if (!cuda_usable(why)) return nullptr;
  return make_staged_backend(make_backend("cuda"));
}

#define RN_BACKEND_OR_SKIP(var, name)  \
  std::string why_;                    \
  auto var = backend_for(name, &why_); \
  if (!var) GTEST_SKIP() << "cuda backend not run: " << why_;

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(v.data(), DType::f32, t.data, t.dtype, v.size());
  return v;
}

HostTensor from_f32(const std::vector<float>& v, Shape shape, DType dtype, Layout layout = Layout::nchw) {
  HostTensor t(shape, dtype, layout);
  convert(t.view().data, dtype, v.data(), DType::f32, v.size());
  return t;
}

// Rank r's slice (batch b) of a whole-batch activation: the batch is the outermost dimension
// in NCHW and NHWC alike, so it is a contiguous block.
Tensor rank_slice(const Tensor& whole, int r, int64_t b) {
  Tensor t = whole;
  t.shape = {b, whole.shape[1], whole.shape[2], whole.shape[3]};
  t.data = static_cast<char*>(whole.data) + static_cast<size_t>(r) * t.bytes();
  return t;
}

// Inputs for a whole batch of `batch`; x has a channel-dependent mean (up to 3 standard
// deviations) so that Q/M - mean^2 has some cancellation to get right.
struct Inputs {
  HostTensor x, residual, dy, gamma, beta;
  std::vector<float> running_mean, running_var;
  Inputs(const BatchNormDesc& d, uint64_t seed) {
    Rng rng(seed);
    const Shape xs = d.x_shape();
    const auto n = static_cast<size_t>(xs.numel());
    std::vector<float> xv(n), rv(n), dyv(n);
    const Tensor probe{nullptr, xs, d.dtype, d.layout};
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t c = 0; c < d.channels; ++c)
        for (int64_t h = 0; h < d.h; ++h)
          for (int64_t w = 0; w < d.w; ++w)
            xv[static_cast<size_t>(probe.offset(b, c, h, w))] = 0.5f * static_cast<float>(c) - 1.0f + rng.normal();
    for (auto& v : rv) v = rng.uniform(-1.0f, 1.0f);
    for (auto& v : dyv) v = rng.uniform(-1.0f, 1.0f);
    x = from_f32(xv, xs, d.dtype, d.layout);
    residual = from_f32(rv, xs, d.dtype, d.layout);
    dy = from_f32(dyv, xs, d.dtype, d.layout);
    std::vector<float> g(static_cast<size_t>(d.channels)), bt(g.size());
    for (auto& v : g) v = rng.uniform(0.5f, 1.5f);
    for (auto& v : bt) v = rng.uniform(-0.5f, 0.5f);
    gamma = from_f32(g, {d.channels}, DType::f32);
    beta = from_f32(bt, {d.channels}, DType::f32);
    running_mean.assign(g.size(), 0.1f);
    running_var.assign(g.size(), 0.9f);
  }
};

// What a training forward + backward produced, in fp32 (activations whole-batch shaped).
struct Outputs {
  std::vector<float> y, dx, dresidual, saved_mean, saved_invstd, running_mean, running_var, dgamma, dbeta;
  HostTensor y_as_stored;  // y in the case dtype, the ranks' backward input
};

Outputs run_whole_batch(Backend& backend, const SyncCase& c, const Inputs& in) {
  const BatchNormDesc d = desc_for(c, c.b * c.ranks);
  auto bn = backend.make_batch_norm(d);
  const Shape xs = d.x_shape(), cs = {c.channels};
  HostTensor y(xs, d.dtype, d.layout), dx(xs, d.dtype, d.layout), dr(xs, d.dtype, d.layout);
  HostTensor sm(cs, DType::f32), si(cs, DType::f32);
  HostTensor rm = from_f32(in.running_mean, cs, DType::f32), rv = from_f32(in.running_var, cs, DType::f32);
  HostTensor dg = from_f32(std::vector<float>(static_cast<size_t>(c.channels), 0.0f), cs, DType::f32),
             db = from_f32(to_f32(dg), cs, DType::f32);
  const bool add = c.fuse == BnFuse::add_relu;
  bn->forward_training(y, sm, si, in.x, add ? &in.residual.view() : nullptr, in.gamma, in.beta, rm, rv);
  bn->backward(dx, add ? &dr.view() : nullptr, dg, db, in.dy, in.x, y, in.gamma, sm, si);
  Outputs out;
  out.y = to_f32(y), out.dx = to_f32(dx), out.dresidual = add ? to_f32(dr) : std::vector<float>{};
  out.saved_mean = to_f32(sm), out.saved_invstd = to_f32(si), out.running_mean = to_f32(rm);
  out.running_var = to_f32(rv), out.dgamma = to_f32(dg), out.dbeta = to_f32(db);
  out.y_as_stored = std::move(y);
  return out;
}

class SyncBatchNorm : public ::testing::TestWithParam<SyncCase> {};

TEST_P(SyncBatchNorm, RanksEqualOneKernelOnTheWholeBatch) {
  const SyncCase& c = GetParam();
  RN_BACKEND_OR_SKIP(backend, c.backend);
  std::string why;
  if (!backend->supports_dtype(c.dtype, &why)) GTEST_SKIP() << why;
  const BatchNormDesc whole = desc_for(c, c.b * c.ranks), local = desc_for(c, c.b);
  const Inputs in(whole, 17);
  const Outputs want = run_whole_batch(*backend, c, in);

  // The ranks write their activations into whole-batch buffers, slice by slice.
  const Shape xs = whole.x_shape(), cs = {c.channels};
  HostTensor y(xs, c.dtype, c.layout), y_again(xs, c.dtype, c.layout), dx(xs, c.dtype, c.layout),
      dr(xs, c.dtype, c.layout);
  const bool add = c.fuse == BnFuse::add_relu;
  struct PerRank {
    HostTensor sm, si, rm, rv, dg, db;
    std::vector<float> dg0, db0;  // parameter gradients before backward: it must add to them
  };
  std::vector<PerRank> per(static_cast<size_t>(c.ranks));
  Rng rng(5);
  for (auto& p : per) {
    p.sm = HostTensor(cs, DType::f32), p.si = HostTensor(cs, DType::f32);
    p.rm = from_f32(in.running_mean, cs, DType::f32), p.rv = from_f32(in.running_var, cs, DType::f32);
    for (int64_t i = 0; i < c.channels; ++i)
      p.dg0.push_back(rng.uniform(-1.0f, 1.0f)), p.db0.push_back(rng.uniform(-1.0f, 1.0f));
    p.dg = from_f32(p.dg0, cs, DType::f32), p.db = from_f32(p.db0, cs, DType::f32);
  }
  std::vector<std::unique_ptr<BatchNormKernel>> kernels;
  for (int r = 0; r < c.ranks; ++r) kernels.push_back(backend->make_batch_norm(local));

  auto slice = [&c](const Tensor& whole_batch, int r) { return rank_slice(whole_batch, r, c.b); };
  SimulatedRanks ranks(c.ranks);
  ranks.run([&](int r, BatchStatsReducer& reducer) {
    BatchNormKernel& bn = *kernels[static_cast<size_t>(r)];
    PerRank& p = per[static_cast<size_t>(r)];
    bn.set_stats_reducer(&reducer);
    const Tensor x = slice(in.x, r), res = slice(in.residual, r), dy = slice(in.dy, r);
    const Tensor yr = slice(y, r), y2 = slice(y_again, r), dxr = slice(dx, r), drr = slice(dr, r);
    bn.forward_training(yr, p.sm, p.si, x, add ? &res : nullptr, in.gamma, in.beta, p.rm, p.rv);
    bn.forward_recompute(y2, x, add ? &res : nullptr, in.gamma, in.beta, p.sm, p.si);
    // The whole batch's y, not the rank's own: see "Backward inputs" above.
    bn.backward(dxr, add ? &drr : nullptr, p.dg, p.db, dy, x, slice(want.y_as_stored, r), in.gamma, p.sm, p.si);
  });
  EXPECT_EQ(ranks.calls_per_rank(), 2) << "one reducer call in forward_training, one in backward, none in recompute";

  const Tolerance tol = tolerance(c.backend, c.dtype);
  auto expect_close = [](const std::vector<float>& got, const std::vector<float>& expected, double bound,
                         const std::string& what) {
    ASSERT_EQ(got.size(), expected.size()) << what;
    const double e = rel_error(got, expected);
    if (std::getenv("RN_SYNC_PRINT")) std::printf("  %-28s %.3g\n", what.c_str(), e);
    EXPECT_LE(e, bound) << what << ": relative error " << e;
  };
  expect_close(to_f32(y), want.y, tol.activations, "y");
  EXPECT_EQ(std::memcmp(y.view().data, y_again.view().data, y.view().bytes()), 0)
      << "forward_recompute must rewrite y bit for bit";
  expect_close(to_f32(dx), want.dx, tol.activations, "dx");
  if (add) expect_close(to_f32(dr), want.dresidual, tol.activations, "dresidual");
  const auto nc = static_cast<size_t>(c.channels);
  std::vector<float> dg_sum(nc, 0.0f), db_sum(nc, 0.0f);
  for (int r = 0; r < c.ranks; ++r) {
    const PerRank& p = per[static_cast<size_t>(r)];
    const std::string rank = "rank " + std::to_string(r) + " ";
    expect_close(to_f32(p.sm), want.saved_mean, tol.statistics, rank + "saved_mean");
    expect_close(to_f32(p.si), want.saved_invstd, tol.statistics, rank + "saved_invstd");
    expect_close(to_f32(p.rm), want.running_mean, tol.statistics, rank + "running_mean");
    expect_close(to_f32(p.rv), want.running_var, tol.statistics, rank + "running_var");
    // Every rank derives its statistics from the same reduced sums: identical bits.
    for (auto [a, b] : {std::pair{&p.sm, &per[0].sm}, {&p.si, &per[0].si}, {&p.rm, &per[0].rm}, {&p.rv, &per[0].rv}})
      EXPECT_EQ(std::memcmp(a->view().data, b->view().data, a->view().bytes()), 0) << rank << "vs rank 0";
    const std::vector<float> dg = to_f32(p.dg), db = to_f32(p.db);
    for (size_t i = 0; i < nc; ++i) {
      dg_sum[i] += dg[i] - p.dg0[i];
      db_sum[i] += db[i] - p.db0[i];
    }
  }
  // (The fp32 subtraction of the initial values costs up to 2^-24 of them: well inside.)
  expect_close(dg_sum, want.dgamma, tol.param_grads, "dgamma summed over ranks");
  expect_close(db_sum, want.dbeta, tol.param_grads, "dbeta summed over ranks");
}

std::vector<SyncCase> sync_cases() {
  std::vector<SyncCase> cases;
  for (const char* backend : {"ref", "cpu"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (std::string(backend) == "ref" && dtype != DType::f32) continue;  // ref computes fp32 only
      for (Layout layout : {Layout::nchw, Layout::nhwc})
        for (BnFuse fuse : {BnFuse::none, BnFuse::relu, BnFuse::add_relu})
          for (int ranks : {1, 3}) cases.push_back({backend, dtype, layout, fuse, ranks});
    }
  // cpu NHWC runs the passes of its per-rank NHWC loops: also a shape that reaches their
  // 64- and 16-channel register blocks and their second chunk of pixels (147 per rank, chunks
  // of 128), with channel means up to 40 standard deviations from zero.
  for (DType dtype : {DType::f32, DType::bf16})
    for (BnFuse fuse : {BnFuse::relu, BnFuse::add_relu}) {
      SyncCase big{"cpu", dtype, Layout::nhwc, fuse, 2};
      big.b = 3, big.channels = 81, big.h = 7, big.w = 7;
      cases.push_back(big);
    }
  // cuda: NHWC only; fp16 too. The whole batch's statistics are one-pass fp32 (Welford), the
  // ranks' fp64 sums: within the cpu bounds.
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (BnFuse fuse : {BnFuse::none, BnFuse::relu, BnFuse::add_relu})
      for (int ranks : {1, 3}) cases.push_back({"cuda", dtype, Layout::nhwc, fuse, ranks});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, SyncBatchNorm, ::testing::ValuesIn(sync_cases()), case_name);

// A single rank's reducer: sum() over one rank leaves the values as they are.
struct CountingReducer final : BatchStatsReducer {
  int calls = 0;
  void sum(double*, int64_t) override { ++calls; }
};

// Per backend (and the dtypes it computes): the checks that need one rank only.
class SyncBatchNormSingle : public ::testing::TestWithParam<SyncCase> {};

// forward_recompute cannot recompute global statistics; it must still notice an input that
// changed since forward_training (or foreign saved statistics) instead of renormalising
// silently with statistics that no longer belong to it.
TEST_P(SyncBatchNormSingle, RecomputeRejectsChangedInputs) {
  const SyncCase& c = GetParam();
  RN_BACKEND_OR_SKIP(backend, c.backend);
  std::string why;
  if (!backend->supports_dtype(c.dtype, &why)) GTEST_SKIP() << why;
  const BatchNormDesc d = desc_for(c, c.b);
  Inputs in(d, 3);
  auto bn = backend->make_batch_norm(d);
  CountingReducer reducer;
  const bool add = c.fuse == BnFuse::add_relu;
  const Shape cs = {c.channels};
  HostTensor y(d.x_shape(), c.dtype, c.layout), sm(cs, DType::f32), si(cs, DType::f32);
  HostTensor rm = from_f32(in.running_mean, cs, DType::f32), rv = from_f32(in.running_var, cs, DType::f32);
  const Tensor* res = add ? &in.residual.view() : nullptr;
  bn->set_stats_reducer(&reducer);
  EXPECT_THROW(bn->forward_recompute(y, in.x, res, in.gamma, in.beta, sm, si), Error) << "no forward yet";
  bn->forward_training(y, sm, si, in.x, res, in.gamma, in.beta, rm, rv);
  EXPECT_NO_THROW(bn->forward_recompute(y, in.x, res, in.gamma, in.beta, sm, si));
  // Another saved mean.
  const float mean0 = sm.ptr<float>()[0];
  sm.ptr<float>()[0] = std::nextafter(mean0, 1e9f);
  EXPECT_THROW(bn->forward_recompute(y, in.x, res, in.gamma, in.beta, sm, si), Error) << "changed saved_mean";
  sm.ptr<float>()[0] = mean0;
  // Another input: the last element (a channel other than 0 in NCHW) one step larger.
  std::vector<float> xv = to_f32(in.x);
  xv.back() = xv.back() + std::abs(xv.back()) * 0.25f + 0.125f;
  const HostTensor x2 = from_f32(xv, d.x_shape(), c.dtype, c.layout);
  EXPECT_THROW(bn->forward_recompute(y, x2, res, in.gamma, in.beta, sm, si), Error) << "changed x";
  EXPECT_EQ(reducer.calls, 1) << "only forward_training communicates";
}

// Inference ignores the reducer; setting it back to nullptr returns to per-rank statistics
// (for the cpu backend, oneDNN or its NHWC loops again): bit for bit what a kernel that never
// had one does.
TEST_P(SyncBatchNormSingle, InferenceAndUnsetAreUnchanged) {
  const SyncCase& c = GetParam();
  RN_BACKEND_OR_SKIP(backend, c.backend);
  std::string why;
  if (!backend->supports_dtype(c.dtype, &why)) GTEST_SKIP() << why;
  const BatchNormDesc d = desc_for(c, c.b);
  Inputs in(d, 9);
  auto plain = backend->make_batch_norm(d), synced = backend->make_batch_norm(d);
  CountingReducer reducer;
  synced->set_stats_reducer(&reducer);
  EXPECT_EQ(synced->stats_reducer(), &reducer);
  const bool add = c.fuse == BnFuse::add_relu;
  const Shape cs = {c.channels};
  const Tensor* res = add ? &in.residual.view() : nullptr;
  HostTensor rm = from_f32(in.running_mean, cs, DType::f32), rv = from_f32(in.running_var, cs, DType::f32);
  auto bits = [](const HostTensor& t) {
    const char* p = static_cast<const char*>(t.view().data);
    return std::vector<char>(p, p + t.view().bytes());
  };
  HostTensor y1(d.x_shape(), c.dtype, c.layout), y2(d.x_shape(), c.dtype, c.layout);
  plain->forward_inference(y1, in.x, res, in.gamma, in.beta, rm, rv);
  synced->forward_inference(y2, in.x, res, in.gamma, in.beta, rm, rv);
  EXPECT_EQ(bits(y2), bits(y1)) << "inference";
  EXPECT_EQ(reducer.calls, 0) << "inference does not communicate";

  synced->set_stats_reducer(nullptr);
  EXPECT_EQ(synced->stats_reducer(), nullptr);
  HostTensor sm1(cs, DType::f32), si1(cs, DType::f32), sm2(cs, DType::f32), si2(cs, DType::f32);
  HostTensor rm2 = from_f32(in.running_mean, cs, DType::f32), rv2 = from_f32(in.running_var, cs, DType::f32);
  plain->forward_training(y1, sm1, si1, in.x, res, in.gamma, in.beta, rm, rv);
  synced->forward_training(y2, sm2, si2, in.x, res, in.gamma, in.beta, rm2, rv2);
  EXPECT_EQ(bits(y2), bits(y1)) << "training after unsetting the reducer";
  EXPECT_EQ(bits(si2), bits(si1)) << "training after unsetting the reducer";
  EXPECT_EQ(reducer.calls, 0);
}

std::vector<SyncCase> single_cases() {
  std::vector<SyncCase> cases;
  for (BnFuse fuse : {BnFuse::none, BnFuse::add_relu}) {
    cases.push_back({"ref", DType::f32, Layout::nchw, fuse, 1});
    for (DType dtype : {DType::f32, DType::bf16})
      for (Layout layout : {Layout::nchw, Layout::nhwc}) cases.push_back({"cpu", dtype, layout, fuse, 1});
    for (DType dtype : {DType::f32, DType::f16}) cases.push_back({"cuda", dtype, Layout::nhwc, fuse, 1});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, SyncBatchNormSingle, ::testing::ValuesIn(single_cases()), case_name);

// A backend has to opt in: the base class refuses a reducer with rn::Unsupported (so that a
// backend without synchronised BN never trains on per-rank statistics by accident).
class NoSyncKernel final : public BatchNormKernel {
 public:
  using BatchNormKernel::BatchNormKernel;

 protected:
  void do_forward_training(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor*, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&) override {}
  void do_forward_inference(const Tensor&, const Tensor&, const Tensor*, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) override {}
  void do_forward_recompute(const Tensor&, const Tensor&, const Tensor*, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) override {}
  void do_backward(const Tensor&, const Tensor*, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
};

TEST(SyncBatchNormContract, BaseClassRefusesAReducer) {
  NoSyncKernel bn(BatchNormDesc{});
  CountingReducer reducer;
  try {
    bn.set_stats_reducer(&reducer);
    FAIL() << "expected rn::Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("synchronised"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bn.stats_reducer(), nullptr) << "a refused reducer is not kept";
  EXPECT_NO_THROW(bn.set_stats_reducer(nullptr));
}

}  // namespace
}  // namespace rn::testing

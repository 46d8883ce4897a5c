// The CUDA fused training step (backends/cuda/fused_step.cu) against the host's reference
// (ops/fused_step.h, make_host_fused_step), step by step from the same state: the overflow
// check, the loss-scale rule and its counters on the device, the skipped step, the learning
// rate from the device table, SGD (plain, Nesterov, weight decay on some parameters) and LARS
// over parameters longer than one segment, the half copy, and the O3 rounding of the master.
//
// Built twice, as cuda_kernels_test.cpp is: CudaFusedStep.* on a GPU (test_ops) and
// CudaFusedStepOnCpu.* in the CPU emulation (test_cuda_sim, every CI run).
#if defined(RN_HAVE_CUDA) || defined(RN_CUDA_SIM)
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/backend.h"
#include "ops/fused_step.h"

#include "cuda_test_util.h"

#ifdef RN_CUDA_SIM
#define CudaFusedStep CudaFusedStepOnCpu
#endif

namespace rn::cuda {
namespace {

using namespace rn::cuda::testing;

// The cuda backend's fused step (in the emulation, the same code on the CPU).
struct DeviceStep {
  explicit DeviceStep(const FusedStepDesc& d) : backend(make_backend("cuda")), step(backend->make_fused_step(d)) {}
  std::unique_ptr<Backend> backend;
  std::unique_ptr<FusedStepKernel> step;
};

Tensor flat(void* data, int64_t n, DType t, Device device) {
  Tensor x;
  x.data = data;
  x.shape = {n};
  x.dtype = t;
  x.device = device;
  return x;
}

float read_scale(const Tensor& t) {
  float v = 0.0f;
  RN_CUDA_CHECK(cudaDeviceSynchronize());  // the step ran on the backend's own stream
  RN_CUDA_CHECK(cudaMemcpy(&v, t.data, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

// Parameters: a gap before the second one (flat buffers may hold padding the step must not
// touch), the second three segments (32768 elements each) long, the third not adapted by
// LARS.
FusedStepDesc make_desc(FusedOptimizer opt, bool nesterov, DType half, bool round_master) {
  FusedStepDesc d;
  d.params = {{0, 1000, 1e-4f, true}, {1024, 70000, 0.0f, true}, {71024, 300, 5e-5f, false}};
  d.total = 71324;
  d.optimizer = opt;
  d.nesterov = nesterov;
  d.momentum = 0.9f;
  d.lars_eta = 0.02;
  d.lars_eps = 1e-9;
  d.loss_scale.dynamic = true;
  d.loss_scale.growth_interval = 2;  // the scale grows within the test's steps
  d.loss_scale.min_scale = 1.0;
  d.loss_scale.max_scale = 65536.0;
  d.half = half;
  d.round_master_to_half = round_master;
  return d;
}

struct Case {
  const char* name;
  FusedOptimizer opt;
  bool nesterov;
  DType half;
  bool round_master;
  bool lr_table;
};

// Runs the same steps through both and compares after each one, bit for bit: the update is
// the same arithmetic per element on both sides (ops/fused_math.h; fused_step.cu is built
// without multiply-add contraction). LARS's norms are sums in double in another order (per
// segment in a tree, then per parameter), so their last bits may differ from the host's; the
// learning rate they scale is rounded to fp32, which these data never move across a
// rounding boundary (an fp32 trust ratio, as the device once had, does).
void compare_steps(const Case& c) {
  SCOPED_TRACE(c.name);
  const FusedStepDesc d = make_desc(c.opt, c.nesterov, c.half, c.round_master);
  const auto n = static_cast<size_t>(d.total);
  DeviceStep dev(d);
  std::unique_ptr<FusedStepKernel> host = make_host_fused_step(d);
  const fused::LossScaleCounters start{128.0, 0, 0, 0, 0};
  dev.step->set_counters(start);
  host->set_counters(start);
  const std::vector<float> lrs = {0.1f, 0.2f, 0.3f, 0.25f, 0.125f, 0.0625f};
  if (c.lr_table) dev.step->set_lr_table(lrs), host->set_lr_table(lrs);

  Rng rng(21);
  std::vector<float> w = random_values(DType::f32, n, rng, 0.0f, 0.5f);
  if (c.round_master)
    for (float& v : w) v = round_to_dtype(v, c.half);
  std::vector<float> w_host = w;
  std::vector<char> half_raw(n * elem_size(c.half));
  convert(half_raw.data(), c.half, w.data(), DType::f32, n);

  Buf wb(DType::f32, n), gb(DType::f32, n);
  std::unique_ptr<Buf> hb;
  wb.set(w);
  if (c.half != DType::f32) {
    hb = std::make_unique<Buf>(c.half, n);
    hb->set(w);
  }
  const Device where = dev.step->loss_scale_tensor().device;
  const Tensor wt = flat(wb.data(), d.total, DType::f32, where), gt = flat(gb.data(), d.total, DType::f32, where);
  std::unique_ptr<Tensor> ht;
  if (hb) ht = std::make_unique<Tensor>(flat(hb->data(), d.total, c.half, where));
  const Tensor w_host_t = flat(w_host.data(), d.total, DType::f32, Device::cpu);
  const Tensor half_host_t = flat(half_raw.data(), d.total, c.half, Device::cpu);

  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double scale = host->counters().scale;
    std::vector<float> g = random_values(DType::f32, n, rng, 0.0f, 0.01f);
    for (float& v : g) v *= static_cast<float>(scale);
    // Step 2 overflows (an inf in the middle of a segment, a NaN at the last element on
    // step 4): skipped, the scale halves, the lr table still advances.
    if (step == 2) g[40000] = std::numeric_limits<float>::infinity();
    if (step == 4) g[n - 1] = std::numeric_limits<float>::quiet_NaN();
    gb.set(g);
    std::vector<float> g_host = g;
    const Tensor g_host_t = flat(g_host.data(), d.total, DType::f32, Device::cpu);
    const float lr = c.lr_table ? -1.0f : 0.05f * static_cast<float>(step + 1);
    dev.step->step(wt, gt, ht.get(), lr);
    host->step(w_host_t, g_host_t, c.half != DType::f32 ? &half_host_t : nullptr, lr);

    const fused::LossScaleCounters a = dev.step->counters(), b = host->counters();
    EXPECT_EQ(a.scale, b.scale);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.clean_steps, b.clean_steps);
    EXPECT_EQ(a.skipped_steps, b.skipped_steps);
    EXPECT_EQ(a.consecutive_skips, b.consecutive_skips);
    EXPECT_EQ(read_scale(dev.step->loss_scale_tensor()), static_cast<float>(b.scale));

    std::vector<float> mom_dev(n), mom_host(n);
    dev.step->read_momentum(mom_dev.data());
    host->read_momentum(mom_host.data());
    const std::vector<float> w_dev = wb.get();
    std::string at;
    EXPECT_TRUE(same_bits(w_dev, w_host, &at)) << "weights: " << at;
    EXPECT_TRUE(same_bits(mom_dev, mom_host, &at)) << "momentum: " << at;
    if (hb) {
      std::vector<float> half_from_host(n);
      convert(half_from_host.data(), DType::f32, half_raw.data(), c.half, n);
      EXPECT_TRUE(same_bits(hb->get(), half_from_host, &at)) << "half copy: " << at;
    }
  }
  const fused::LossScaleCounters end = dev.step->counters();
  EXPECT_EQ(end.skipped_steps, 2);  // steps 2 and 4
  EXPECT_EQ(end.step, 6);
}

TEST(CudaFusedStep, SgdMatchesTheHostBitForBit) {
  RN_REQUIRE_GPU();
  compare_steps({"sgd, f32", FusedOptimizer::sgd, false, DType::f32, false, false});
  compare_steps({"sgd nesterov, fp16 copy, lr table", FusedOptimizer::sgd, true, DType::f16, false, true});
  compare_steps({"sgd, bf16 copy, O3 master rounding", FusedOptimizer::sgd, false, DType::bf16, true, false});
}

TEST(CudaFusedStep, LarsMatchesTheHostBitForBit) {
  RN_REQUIRE_GPU();
  compare_steps({"lars, f32", FusedOptimizer::lars, false, DType::f32, false, true});
  compare_steps({"lars nesterov, fp16 copy", FusedOptimizer::lars, true, DType::f16, false, false});
}

// Sink mode's record: each step that takes its rate from the table copies the loss into the
// entry's slot; a step given its rate (eager) records nothing.
// One fp32 parameter of 64 values without weight decay, and the loss the step reads.
struct OneParamStep {
  static FusedStepDesc desc() {
    FusedStepDesc d;
    d.total = 64;
    d.params = {{0, 64, 0.0f, false}};
    return d;
  }
  OneParamStep() {
    const Device where = dev.step->loss_scale_tensor().device;
    wt = flat(wb.data(), 64, DType::f32, where);
    gt = flat(gb.data(), 64, DType::f32, where);
    dev.step->set_loss_source(flat(loss.data(), 1, DType::f32, where));
  }
  DeviceStep dev{desc()};
  Buf wb{DType::f32, 64}, gb{DType::f32, 64}, loss{DType::f32, 1};
  Tensor wt, gt;
};

TEST(CudaFusedStep, TableStepsRecordTheirLoss) {
  RN_REQUIRE_GPU();
  OneParamStep one;
  auto& [dev, wb, gb, loss, wt, gt] = one;
  gb.set(std::vector<float>(64, 0.5f));
  dev.step->set_lr_table({0.1f, 0.2f, 0.3f});
  // Each step waits for the last: the step reads the loss on the backend's own stream.
  for (int k = 0; k < 3; ++k) {
    loss.set({1.5f + static_cast<float>(k)});
    dev.step->step(wt, gt, nullptr, -1.0f);
    RN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  loss.set({9.0f});
  dev.step->step(wt, gt, nullptr, 0.1f);  // eager: the table's slots keep their values
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(dev.step->table_losses(3), (std::vector<float>{1.5f, 2.5f, 3.5f}));
  EXPECT_THROW(dev.step->table_losses(4), Error);
}

// A captured step holds the table's address: a table of the same size (the next window)
// keeps the graph, a larger one moves the table and makes the graph stale, so that the step
// is captured again rather than replayed against freed memory.
TEST(CudaFusedStep, ALargerTableMakesACapturedStepStale) {
  RN_REQUIRE_GPU();
  OneParamStep one;
  auto& [dev, wb, gb, loss, wt, gt] = one;
  auto graph = dev.backend->make_step_graph();
  ASSERT_NE(graph, nullptr);
  dev.step->set_lr_table({0.1f, 0.2f});
  graph->capture([&] { dev.step->step(wt, gt, nullptr, -1.0f); });
  ASSERT_TRUE(graph->captured());
  dev.step->set_lr_table({0.3f, 0.4f});
  EXPECT_TRUE(graph->captured()) << "a table of the same size stays where it was";
  graph->replay();
  dev.backend->synchronize();
  dev.step->set_lr_table({0.1f, 0.2f, 0.3f, 0.4f});
  EXPECT_FALSE(graph->captured()) << "the table moved under the graph";
  EXPECT_THROW(graph->replay(), Error);
}

}  // namespace
}  // namespace rn::cuda
#endif  // RN_HAVE_CUDA || RN_CUDA_SIM

// The NCCL communicator compiles and links in CUDA builds; on a machine without a GPU it
// refuses with a clear error. On a GPU (scripts/gpu-check.sh runs Nccl.*) a one-rank
// communicator runs its collectives on device buffers: the ordering after the compute
// stream, join() making later compute work wait, and wait() after join().
#include <gtest/gtest.h>

#include <vector>

#include "core/check.h"
#include "dist/nccl_communicator.h"
#include "ops/backend.h"

namespace rn {
namespace {

TEST(Nccl, WithoutAGpuOrNcclTheErrorSaysWhy) {
  auto host = make_local_communicator();
  try {
    auto c = make_nccl_communicator(*host, 0, nullptr, 10);
    GTEST_SKIP() << "a GPU is present: the NCCL communicator is exercised by scripts/gpu-check.sh";
  } catch (const Error& e) {
    const std::string m = e.what();
    if (nccl_available())
      EXPECT_NE(m.find("no usable CUDA device"), std::string::npos) << m;
    else
      EXPECT_NE(m.find("this build has no NCCL"), std::string::npos) << m;
  }
}

TEST(Nccl, OneRankCollectivesOnTheGpuOrderWithTheComputeStream) {
  std::unique_ptr<Backend> gpu;
  try {
    gpu = make_backend("cuda");
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no GPU: the NCCL collectives are not run here (" << e.what() << ")";
  }
  auto host = make_local_communicator();
  auto nccl = make_nccl_communicator(*host, 0, gpu->native_stream(), 30);
  ASSERT_EQ(nccl->size(), 1);
  const int64_t n = 3 * 1024 * 1024 + 5;  // several NCCL chunks, and an odd tail
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 1001) - 7.0f;
  MemorySpace& mem = gpu->memory();
  DeviceBuffer a(mem, static_cast<size_t>(n) * 4), b(mem, static_cast<size_t>(n) * 4);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
    mem.zero(b.data(), b.bytes());
    // Queued on the compute stream without waiting: NCCL must order after it.
    mem.copy_to_device_async(a.data(), values.data(), a.bytes());
    const Communicator::Ticket t = nccl->all_reduce_async(a.data(), n, ElemType::f32, op, "test buffer");
    nccl->join(t);
    mem.copy_to_device_async(b.data(), a.data(), b.bytes());  // compute work after the join
    gpu->synchronize();
    std::vector<float> got(static_cast<size_t>(n));
    mem.copy(got.data(), b.data(), b.bytes());
    EXPECT_EQ(got, values) << "one rank: the " << (op == ReduceOp::sum ? "sum" : "average")
                           << " is the input itself, read after the join";
    nccl->wait(t);  // after join: returns, and again
    nccl->wait(t);
  }
  int64_t word = 42;
  DeviceBuffer w(mem, sizeof(word));
  mem.copy(w.data(), &word, sizeof(word));
  nccl->broadcast(w.data(), sizeof(word), 0);
  int64_t back = 0;
  mem.copy(&back, w.data(), sizeof(back));
  EXPECT_EQ(back, 42);
}

}  // namespace
}  // namespace rn

// One rank of an MPI job on the CUDA emulation's NCCL (src/backends/cuda/sim/nccl_sim.cpp),
// started by tests/dist/emulated_gpus_test.cpp under mpirun with RN_SIM_DEVICES=2. argv[1]:
//   collectives   sums, averages, maxima and broadcasts of several types between the ranks,
//                 also recorded in a CUDA graph and replayed;
//   mismatch      rank 0 all-reduces 4 values, rank 1 8: every rank stops with an error
//                 naming both collectives (on GPUs, a hang);
//   same-device   both ranks on device 0: NCCL refuses the communicator;
//   own-id        each rank makes its own unique id (not broadcast): refused.
// Prints "nccl_sim_worker: rank R OK" when what happened is what should have.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int g_rank = 0;
bool g_ok = true;
cudaStream_t g_stream = nullptr;  // the collectives' stream, which a read of their results waits for

void expect(bool cond, const std::string& what) {
  if (cond) return;
  std::printf("nccl_sim_worker: rank %d: FAILED: %s\n", g_rank, what.c_str());
  g_ok = false;
}

template <typename T>
T* device_copy(const std::vector<T>& v) {
  void* p = nullptr;
  cudaMalloc(&p, v.size() * sizeof(T));
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  cudaStreamSynchronize(g_stream);
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

void collectives(ncclComm_t comm, int size, cudaStream_t s) {
  const size_t n = 1000;
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(i) * 0.5f + static_cast<float>(g_rank);
  float* df = device_copy(f);
  expect(ncclAllReduce(df, df, n, ncclFloat32, ncclSum, comm, s) == ncclSuccess, "fp32 sum issued");
  std::vector<float> got = host_copy(df, n);
  bool same = true;
  for (size_t i = 0; i < n; ++i)
    same = same && got[i] == static_cast<float>(i) * 0.5f * size + static_cast<float>(size * (size - 1) / 2);
  expect(same, "fp32 sum over the ranks");
  // Average and maximum in bf16: 1.0 on rank 0, 3.0 on rank 1 -> 2.0 and 3.0 (exact in bf16).
  const uint16_t one = 0x3f80, three = 0x4040, two = 0x4000;
  std::vector<uint16_t> b(8, g_rank == 0 ? one : three);
  uint16_t* db = device_copy(b);
  expect(ncclAllReduce(db, db, 8, ncclBfloat16, ncclAvg, comm, s) == ncclSuccess, "bf16 avg issued");
  expect(host_copy(db, 8) == std::vector<uint16_t>(8, two), "bf16 average");
  std::vector<uint16_t> m(8, g_rank == 0 ? one : three);
  uint16_t* dm = device_copy(m);
  expect(ncclAllReduce(dm, dm, 8, ncclBfloat16, ncclMax, comm, s) == ncclSuccess, "bf16 max issued");
  expect(host_copy(dm, 8) == std::vector<uint16_t>(8, three), "bf16 maximum");
  // int64 sums are exact beyond 2^53.
  std::vector<int64_t> k(3, (int64_t{1} << 60) + g_rank);
  int64_t* dk = device_copy(k);
  expect(ncclAllReduce(dk, dk, 3, ncclInt64, ncclSum, comm, s) == ncclSuccess, "int64 sum issued");
  expect(host_copy(dk, 3) == std::vector<int64_t>(3, size * (int64_t{1} << 60) + size * (size - 1) / 2),
         "int64 sum");
  // Broadcast from the last rank.
  std::vector<uint8_t> bytes(37, static_cast<uint8_t>(10 + g_rank));
  uint8_t* dbytes = device_copy(bytes);
  expect(ncclBroadcast(dbytes, dbytes, 37, ncclUint8, size - 1, comm, s) == ncclSuccess, "broadcast issued");
  expect(host_copy(dbytes, 37) == std::vector<uint8_t>(37, static_cast<uint8_t>(10 + size - 1)), "broadcast");
  // Captured on a side stream joined to the captured one, then replayed twice: the sums run
  // at the replays (each doubles the values, on every rank alike).
  cudaStream_t side;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t fork, join;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  std::vector<float> one_f(16, 1.0f);
  float* dg = device_copy(one_f);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  expect(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture begun");
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(side, fork, 0);
  expect(ncclAllReduce(dg, dg, 16, ncclFloat32, ncclSum, comm, side) == ncclSuccess, "captured sum issued");
  cudaEventRecord(join, side);
  cudaStreamWaitEvent(s, join, 0);
  expect(cudaStreamEndCapture(s, &graph) == cudaSuccess, "capture ended");
  expect(host_copy(dg, 16) == one_f, "a captured collective does not run during the capture");
  cudaGraphInstantiate(&exec, graph, 0);
  for (int r = 0; r < 2; ++r) expect(cudaGraphLaunch(exec, s) == cudaSuccess, "replay");
  expect(host_copy(dg, 16) == std::vector<float>(16, static_cast<float>(size * size)), "two replays of the sum");
  expect(cudaGetLastError() == cudaSuccess, "no CUDA error");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  for (void* p : {static_cast<void*>(df), static_cast<void*>(db), static_cast<void*>(dm), static_cast<void*>(dk),
                  static_cast<void*>(dbytes), static_cast<void*>(dg)})
    cudaFree(p);
}

void mismatch(ncclComm_t comm, cudaStream_t s) {
  std::vector<float> f(8, 1.0f);
  float* d = device_copy(f);
  const size_t n = g_rank == 0 ? 4 : 8;
  expect(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, comm, s) == ncclSuccess, "issued");
  expect(cudaStreamSynchronize(s) != cudaSuccess, "the synchronisation reports the failed collective");
  const cudaError_t e = cudaGetLastError();
  const std::string msg = cudaGetErrorString(e);
  std::printf("nccl_sim_worker: rank %d: %s\n", g_rank, msg.c_str());
  expect(e != cudaSuccess, "a CUDA error after mismatched collectives");
  expect(msg.find("ncclAllReduce #1 of 4 float32 values (sum)") != std::string::npos &&
             msg.find("ncclAllReduce #1 of 8 float32 values (sum)") != std::string::npos,
         "the error names both collectives");
  expect(cudaGetLastError() == e, "the error is sticky");
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  expect(async == ncclInvalidUsage, "the communicator reports the error");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;  // the emulated NCCL calls MPI from whichever thread waits for a collective
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  expect(cudaSetDevice(mode == "same-device" ? 0 : g_rank) == cudaSuccess, "cudaSetDevice (RN_SIM_DEVICES set?)");
  ncclUniqueId id;
  if (g_rank == 0 || mode == "own-id") ncclGetUniqueId(&id);
  if (mode != "own-id") MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRank(&comm, size, id, g_rank);
  if (mode == "same-device" || mode == "own-id") {
    const std::string msg = ncclGetLastError(nullptr);
    std::printf("nccl_sim_worker: rank %d: %s\n", g_rank, msg.c_str());
    expect(init != ncclSuccess, "the communicator is refused");
    expect(msg.find(mode == "same-device" ? "both use device 0" : "another unique id") != std::string::npos,
           "the refusal says why");
  } else {
    expect(init == ncclSuccess, std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    g_stream = s;
    if (init == ncclSuccess) (mode == "mismatch" ? mismatch(comm, s) : collectives(comm, size, s));
    ncclCommDestroy(comm);
    cudaStreamDestroy(s);
  }
  if (g_ok) std::printf("nccl_sim_worker: rank %d OK\n", g_rank);
  std::fflush(stdout);
  MPI_Finalize();
  return g_ok ? 0 : 1;
}

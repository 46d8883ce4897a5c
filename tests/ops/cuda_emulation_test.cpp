// The CUDA emulation's model of the runtime (src/backends/cuda/sim): what a GPU refuses
// about streams, events, devices and NCCL, it refuses too, so that code which would fail on
// a GPU fails in CI. Only in test_cuda_sim (suite CudaEmulationOnCpu).
#ifdef RN_CUDA_SIM
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_algo_cache.h"
#include "backends/cuda/launch.h"
#include "ops/conv2d.h"
#include "train/log_capture.h"

#ifdef RN_SIM_HAVE_NCCL  // rn_train is linked too
#include <nccl.h>

#include "train/small_run.h"
#include "train/stop_at_load.h"
#include "train/test_dir.h"
#endif

namespace rn {
namespace {

__global__ void add_one(float* p, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] += 1.0f;
}

// Sets $RN_SIM_DEVICES for the test's scope (the emulation reads it at every call) and
// leaves device 0 current.
struct Devices {
  explicit Devices(int n) { setenv("RN_SIM_DEVICES", std::to_string(n).c_str(), 1); }
  ~Devices() {
    cudaSetDevice(0);
    unsetenv("RN_SIM_DEVICES");
  }
};

std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

struct Streams {
  cudaStream_t origin = nullptr, side = nullptr;
  float* buf = nullptr;
  Streams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 64 * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(buf, 0, 64 * sizeof(float)), cudaSuccess);
  }
  ~Streams() {
    cudaFree(buf);
    cudaStreamDestroy(side);
    cudaStreamDestroy(origin);
  }
};

// A stream that waits for an event recorded in a capture joins it (its work is captured,
// not run); it must be joined back before the capture ends, as on a GPU.
TEST(CudaEmulationOnCpu, AStreamForkedIntoACaptureIsCapturedAndMustBeJoinedBack) {
  Streams s;
  cudaEvent_t fork, join;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  for (const bool joined : {false, true}) {
    ASSERT_EQ(cudaStreamBeginCapture(s.origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    RN_LAUNCH(dim3(1), dim3(64), s.origin, add_one)(s.buf, 64);
    ASSERT_EQ(cudaEventRecord(fork, s.origin), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(s.side, fork, 0), cudaSuccess);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASSERT_EQ(cudaStreamIsCapturing(s.side, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusActive) << "the forked stream is in the capture";
    RN_LAUNCH(dim3(1), dim3(64), s.side, add_one)(s.buf, 64);
    EXPECT_EQ(last_error(), "");
    if (joined) {
      ASSERT_EQ(cudaEventRecord(join, s.side), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(s.origin, join, 0), cudaSuccess);
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s.origin, &graph);
    ASSERT_EQ(cudaStreamIsCapturing(s.side, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone) << "the capture is over for every stream in it";
    std::vector<float> host(64, -1.0f);
    ASSERT_EQ(cudaMemcpy(host.data(), s.buf, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[5], 0.0f) << "captured work, the forked stream's too, did not run during the capture";
    if (!joined) {
      EXPECT_EQ(end, cudaErrorStreamCaptureUnjoined);
      EXPECT_EQ(graph, nullptr);
      const std::string e = last_error();
      EXPECT_NE(e.find("not joined back"), std::string::npos) << e;
      continue;
    }
    ASSERT_EQ(end, cudaSuccess) << last_error();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s.origin), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s.origin), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), s.buf, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[5], 0.0f) << "the replays are the stream's work: not run until something waits for it";
    ASSERT_EQ(cudaStreamSynchronize(s.origin), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), s.buf, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[5], 4.0f) << "two replays of both streams' launches";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
}

TEST(CudaEmulationOnCpu, AnEventRecordedInACaptureOnlyOrdersTheCapture) {
  Streams s;
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s.origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, s.origin), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaGetLastError(), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaStreamQuery(s.origin), cudaErrorStreamCaptureUnsupported) << "querying a captured stream";
  cudaGetLastError();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.origin, &graph), cudaErrorStreamCaptureInvalidated) << "the query broke it";
  cudaGetLastError();
  EXPECT_EQ(cudaEventSynchronize(ev), cudaErrorCapturedEvent) << "still last recorded in a capture";
  EXPECT_EQ(cudaStreamWaitEvent(s.side, ev, 0), cudaErrorCapturedEvent) << "outside its capture";
  cudaGetLastError();
  ASSERT_EQ(cudaEventRecord(ev, s.origin), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess) << "recorded outside a capture: complete";
  cudaEventDestroy(ev);
}

// A captured stream may not wait on an event recorded outside its capture (the dependency
// would cross the capture's boundary: cudaErrorStreamCaptureIsolation), done or not, unless
// the wait is made an external-event node.
TEST(CudaEmulationOnCpu, ACaptureMayNotWaitOnAnEventRecordedOutsideIt) {
  Streams s;
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, s.side), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s.origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s.origin, ev, cudaEventWaitExternal), cudaSuccess) << "an external-event node";
  EXPECT_NE(cudaStreamWaitEvent(s.origin, ev, 0), cudaSuccess);
  cudaGetLastError();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.origin, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
  EXPECT_EQ(cudaStreamWaitEvent(s.origin, ev, 0), cudaSuccess) << "outside a capture";
  cudaEventDestroy(ev);
}

// Timing events measure the host time between their records (the work between them ran
// in between); events made without timing cannot be timed.
TEST(CudaEmulationOnCpu, EventsTimeTheWorkBetweenThemUnlessMadeWithoutTiming) {
  Streams s;
  cudaEvent_t a, b, untimed;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&b, cudaEventDefault), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle) << "never recorded";
  cudaGetLastError();
  ASSERT_EQ(cudaEventRecord(a, s.origin), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(cudaEventRecord(b, s.origin), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s.origin), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 25.0f);
  EXPECT_LT(ms, 10000.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_NE(last_error().find("cudaEventDisableTiming"), std::string::npos);
  for (cudaEvent_t e : {a, b, untimed}) cudaEventDestroy(e);
}

// Sink mode checks the capture after each plan step: a step that invalidates it (here a
// synchronisation, which a capture cannot hold) is named, not only the end of the capture.
TEST(CudaEmulationOnCpu, TheStepGraphNamesTheStepThatInvalidatedItsCapture) {
  auto backend = make_cuda_backend(CudaBackendOptions{});
  auto graph = backend->make_step_graph();
  ASSERT_NE(graph, nullptr);
  void* p = backend->memory().allocate(256);
  auto stream = static_cast<cudaStream_t>(backend->native_stream());
  try {
    graph->capture([&] {
      backend->memory().zero(p, 256);
      graph->check_capture("a good step");
      (void)cudaStreamSynchronize(stream);  // refused during a capture, which it invalidates
      graph->check_capture("the bad step");
      FAIL() << "check_capture did not see the invalidated capture";
    });
    FAIL() << "the capture succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("invalidated in 'the bad step'"), std::string::npos) << m;
  }
  EXPECT_FALSE(graph->captured());
  (void)cudaGetLastError();
  graph->capture([&] { backend->memory().zero(p, 256); });  // the stream captures again afterwards
  EXPECT_TRUE(graph->captured());
  graph->replay();
  backend->synchronize();
  backend->memory().free(p);
}

// An allocation the device cannot satisfy is an out-of-memory error the caller may catch and
// go on from (bench --find-max-batch does): the failed cudaMalloc's error must not stay in
// the thread's last-error slot, where the next launch check would blame a kernel for it.
TEST(CudaEmulationOnCpu, AFailedAllocationLeavesNoErrorForTheNextLaunch) {
  auto backend = make_cuda_backend(CudaBackendOptions{});
  try {
    backend->memory().allocate(size_t{1} << 62);
    FAIL() << "a 4 EiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = backend->memory().allocate(1024);  // and the device goes on working
  backend->memory().zero(p, 1024);
  backend->synchronize();
  backend->memory().free(p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A kernel may not be launched into a stream of another device than the current one; an
// event belongs to the device it was made on.
TEST(CudaEmulationOnCpu, ALaunchIntoAnotherDevicesStreamIsRefused) {
  Devices two(2);
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t on1 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking), cudaSuccess);
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 16 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0, 16 * sizeof(float)), cudaSuccess);
  RN_LAUNCH(dim3(1), dim3(16), on1, add_one)(buf, 16);
  EXPECT_EQ(last_error(), "") << "device 1 is current: its stream takes the launch";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  RN_LAUNCH(dim3(1), dim3(16), on1, add_one)(buf, 16);
  const std::string e = last_error();
  EXPECT_NE(e.find("cudaErrorInvalidResourceHandle"), std::string::npos) << e;
  EXPECT_NE(e.find("add_one"), std::string::npos) << e;
  EXPECT_NE(e.find("device 1 while device 0 is current"), std::string::npos) << e;
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 16 * sizeof(float), 0), cudaSuccess);
  pinned[3] = -1.0f;
  EXPECT_EQ(cudaMemcpyAsync(pinned, buf, 16 * sizeof(float), cudaMemcpyDeviceToHost, on1), cudaSuccess)
      << "copies may";
  EXPECT_EQ(pinned[3], -1.0f) << "into pinned memory the copy is queued: it runs when something waits";
  ASSERT_EQ(cudaStreamSynchronize(on1), cudaSuccess);
  EXPECT_EQ(pinned[3], 1.0f) << "only the launch from device 1 ran";
  float host[16] = {};
  EXPECT_EQ(cudaMemcpyAsync(host, buf, sizeof host, cudaMemcpyDeviceToHost, on1), cudaSuccess);
  EXPECT_EQ(host[3], 1.0f) << "into pageable memory it returns when the copy is done, as on a GPU";
  cudaFreeHost(pinned);
  cudaEvent_t on0;
  ASSERT_EQ(cudaEventCreate(&on0), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(on0, on1), cudaErrorInvalidResourceHandle) << "an event of device 0 in device 1's stream";
  cudaGetLastError();
  cudaEventDestroy(on0);
  cudaFree(buf);
  cudaStreamDestroy(on1);
}

#ifdef RN_SIM_HAVE_NCCL
// One-rank NCCL in the emulation: what NCCL refuses is refused with a message; the average
// of one rank is its input.
TEST(CudaEmulationOnCpu, TheEmulatedNcclRefusesWhatNcclRefuses) {
  Devices two(2);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 1), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 1 of 1"), std::string::npos);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclInvalidUsage) << "two ranks need an MPI job";
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("mpirun"), std::string::npos);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  Streams s;
  const uint16_t h = 0x3c00;  // 1.0 in fp16
  ASSERT_EQ(cudaMemcpy(s.buf, &h, 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(s.buf, s.buf, 1, ncclFloat16, ncclAvg, comm, s.origin), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.origin), cudaSuccess);
  uint16_t back = 0;
  ASSERT_EQ(cudaMemcpy(&back, s.buf, 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
  float host[4] = {};
  EXPECT_EQ(ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, comm, s.origin), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("not device memory"), std::string::npos);
  EXPECT_EQ(ncclAllReduce(s.buf, s.buf, 4, ncclFloat8e4m3, ncclSum, comm, s.origin), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("not emulated"), std::string::npos);
  EXPECT_EQ(ncclBroadcast(s.buf, s.buf, 4, ncclFloat32, 1, comm, s.origin), ncclInvalidArgument) << "root 1 of 1";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t on1 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(s.buf, s.buf, 4, ncclFloat32, ncclSum, comm, on1), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("stream of device 1"), std::string::npos);
  EXPECT_EQ(last_error(), "");
  cudaStreamDestroy(on1);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}
#endif


// cuDNN 9's finer "not supported" codes are not-supported cases (the harness reports them as
// such); the ones that say the installation is unusable are errors.
TEST(CudaEmulationOnCpu, CudnnNotSupportedCodesAreUnsupportedExceptABrokenInstallation) {
  using rn::cuda::cudnn_not_supported;
  for (const cudnnStatus_t s : {CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
                                CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT,
                                CUDNN_STATUS_NOT_SUPPORTED_PADDING, CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM})
    EXPECT_TRUE(cudnn_not_supported(s)) << cudnnGetErrorString(s);
  for (const cudnnStatus_t s : {CUDNN_STATUS_SUCCESS, CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_INTERNAL_ERROR,
                                CUDNN_STATUS_EXECUTION_FAILED, CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH,
                                CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE,
                                CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER})
    EXPECT_FALSE(cudnn_not_supported(s)) << cudnnGetErrorString(s);
}

// cuDNN's convolutions address at most 2^31 - 1 elements per tensor: a larger x or y is
// refused as unsupported before any cuDNN call, naming the largest batch that fits; one
// sample less than the limit is made. (ResNet-50's 224px stem output: 64x112x112 per sample.)
TEST(CudaEmulationOnCpu, AConvolutionTensorBeyondCudnnsElementLimitIsRefusedNamingTheBatch) {
  Conv2dDesc d;
  d.p.in_channels = 64;
  d.p.out_channels = 64;
  d.p.kernel_h = d.p.kernel_w = 1;
  d.in_h = d.in_w = 112;
  d.layout = Layout::nhwc;
  d.dtype = DType::f16;
  const int64_t per_sample = 64 * 112 * 112, most = kCudnnMaxTensorElements / per_sample;
  ASSERT_EQ(most, 2674);
  auto backend = make_cuda_backend(CudaBackendOptions{});
  d.batch = most + 1;
  try {
    backend->make_conv2d(d);
    ADD_FAILURE() << "batch " << d.batch << " was not refused";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("beyond the 2^31 - 1 that cuDNN's convolutions address: at most batch 2674"),
              std::string::npos)
        << e.what();
  }
  d.batch = 2;  // a small one is made as always (the limit is per tensor, not per backend)
  EXPECT_NE(backend->make_conv2d(d), nullptr);
}

// The small 3x3 convolution the algorithm-search tests make: 8 -> 8 channels, 5x5, batch 2, NHWC.
Conv2dDesc small_searched_conv(DType dtype) {
  Conv2dDesc d;
  d.p.in_channels = d.p.out_channels = 8;
  d.p.kernel_h = d.p.kernel_w = 3;
  d.p.pad_h = d.p.pad_w = 1;
  d.batch = 2;
  d.in_h = d.in_w = 5;
  d.layout = Layout::nhwc;
  d.dtype = dtype;
  return d;
}

// The emulated search reports, fastest first, a non-deterministic algorithm for both backward
// directions, then a deterministic one, then one that fails as not supported: the backend
// takes the fastest that ran, and only deterministic ones in high_precision mode. For fp32,
// which always runs with FMA math, the fastest forward algorithm does not run with FMA math
// and the fastest backward-filter one wants 2 GiB of workspace with it (over the 1 GiB
// limit): fp32 takes the next ones, fp16 (tensor-op math) these; and the search reports the
// deterministic backward-data algorithm with FMA math, which fp32 prefers to the faster one
// reported with default math. For fp16 the heuristics, where a deterministic choice comes
// from, put first a forward algorithm that cuDNN then does not run: the backend confirms each
// pick with the workspace query and takes the next, as it must on a GPU, where the heuristics
// predict and only the run decides.
TEST(CudaEmulationOnCpu, TheConvolutionSearchTakesTheFastestAlgorithmThatRanDeterministicInHighPrecision) {
  Conv2dDesc d = small_searched_conv(DType::f32);
  const auto dir = std::filesystem::temp_directory_path() / ("rn_algo_choice_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const DType t : {DType::f32, DType::f16}) {
    for (const CudaImplMode mode : {CudaImplMode::high_performance, CudaImplMode::high_precision}) {
      d.dtype = t;
      const std::string path = (dir / (std::string(dtype_name(t)) + "_" + std::string(cuda_impl_mode_name(mode)) +
                                       ".tsv")).string();
      std::filesystem::remove(path);
      CudaBackendOptions o;
      o.mode = mode;
      o.algo_cache_path = path;
      auto backend = make_cuda_backend(o);
      ASSERT_NE(backend->make_conv2d(d), nullptr);
      std::map<std::string, cuda::CudnnAlgoChoice> chosen;  // direction -> choice
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#') continue;  // the file's header
        std::string key;
        cuda::CudnnAlgoChoice c;
        ASSERT_TRUE(cuda::CudnnAlgoCache::parse_line(line, &key, &c)) << line;
        chosen[key.substr(0, key.find('|'))] = c;
      }
      ASSERT_EQ(chosen.size(), 3u) << path;
      const bool det = mode == CudaImplMode::high_precision;
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(cuda_impl_mode_name(mode)));
      const bool fp32 = t == DType::f32;
      EXPECT_EQ(chosen["fwd"].algo, fp32 ? CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM : CUDNN_CONVOLUTION_FWD_ALGO_GEMM);
      EXPECT_EQ(chosen["bwd_data"].algo,
                det || fp32 ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 : CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
      EXPECT_EQ(chosen["bwd_filter"].algo, det    ? CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
                                           : fp32 ? CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0
                                                  : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3);
      for (const auto& [direction, c] : chosen) {
        EXPECT_GT(c.workspace, 0u) << direction;
        EXPECT_LE(c.workspace, size_t{1} << 30) << direction;
        EXPECT_EQ(c.math_type, t == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH) << direction;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// A measured search may rank the algorithms otherwise on another run (timing noise; here
// $RN_SIM_SEARCH_ORDER=reversed): high_performance follows the measurement, while a
// deterministic choice (run.deterministic, high_precision) comes from cuDNN's heuristics and
// is the same every time, so that two runs with cold caches are bit-identical.
TEST(CudaEmulationOnCpu, ADeterministicAlgorithmChoiceDoesNotDependOnTheMeasuredOrder) {
  const Conv2dDesc d = small_searched_conv(DType::f32);
  const auto dir = std::filesystem::temp_directory_path() / ("rn_algo_order_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto forward_algo = [&](bool deterministic, bool reversed) {
    const std::string path = (dir / "cache.tsv").string();
    std::filesystem::remove(path);
    if (reversed)
      setenv("RN_SIM_SEARCH_ORDER", "reversed", 1);
    else
      unsetenv("RN_SIM_SEARCH_ORDER");
    CudaBackendOptions o;
    o.algo_cache_path = path;
    o.deterministic = deterministic;
    EXPECT_NE(make_cuda_backend(o)->make_conv2d(d), nullptr);
    unsetenv("RN_SIM_SEARCH_ORDER");
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      std::string key;
      cuda::CudnnAlgoChoice c;
      if (line.rfind("fwd|", 0) == 0 && cuda::CudnnAlgoCache::parse_line(line, &key, &c)) return c.algo;
    }
    ADD_FAILURE() << "no forward entry in " << path;
    return -1;
  };
  EXPECT_EQ(forward_algo(false, false), CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  EXPECT_EQ(forward_algo(false, true), CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) << "the measurement decides";
  EXPECT_EQ(forward_algo(true, false), CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  EXPECT_EQ(forward_algo(true, true), CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM) << "the heuristics decide";
  std::filesystem::remove_all(dir);
}

// A cache entry that parses but cannot run (an algorithm outside cuDNN's list, a workspace
// below what the algorithm needs, a math type cuDNN does not define: a file edited by hand)
// is not handed to cuDNN, whose error would not name the file: it is searched again with a
// warning that names the file and the entry, and the file gets the searched choice back.
TEST(CudaEmulationOnCpu, AnAlgorithmCacheEntryThatCannotRunIsSearchedAgainWithAWarning) {
  // fp16: its math type is used as cached (fp32 always runs with FMA math).
  const Conv2dDesc d = small_searched_conv(DType::f16);
  const auto dir = std::filesystem::temp_directory_path() / ("rn_algo_edit_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "cache.tsv").string();
  auto read = [&] {
    std::map<std::string, std::pair<std::string, cuda::CudnnAlgoChoice>> by_dir;  // direction -> key, choice
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::string key;
      cuda::CudnnAlgoChoice c;
      EXPECT_TRUE(cuda::CudnnAlgoCache::parse_line(line, &key, &c)) << line;
      by_dir[key.substr(0, key.find('|'))] = {key, c};
    }
    return by_dir;
  };
  CudaBackendOptions o;
  o.algo_cache_path = path;
  ASSERT_NE(make_cuda_backend(o)->make_conv2d(d), nullptr);
  const auto searched = read();
  ASSERT_EQ(searched.size(), 3u);

  std::map<std::string, cuda::CudnnAlgoChoice> edited;
  for (const auto& [direction, entry] : searched) edited[direction] = entry.second;
  edited["fwd"].algo = 99;
  edited["bwd_data"].workspace = 0;
  edited["bwd_filter"].math_type = 9;
  {
    std::ofstream out(path, std::ios::trunc);
    for (const auto& [direction, c] : edited)
      out << cuda::CudnnAlgoCache::format_line(searched.at(direction).first, c) << "\n";
  }
  LogCapture log;
  ASSERT_NE(make_cuda_backend(o)->make_conv2d(d), nullptr);
  const std::string text = log.text();
  EXPECT_EQ(log.count("is ignored and searched again"), 3) << text;
  EXPECT_EQ(log.count("cuDNN algorithm cache " + path + ": the entry "), 3) << text;
  EXPECT_NE(text.find("algorithm 99 is not one of cuDNN's"), std::string::npos) << text;
  EXPECT_NE(text.find("its workspace of 0 bytes is less than"), std::string::npos) << text;
  EXPECT_NE(text.find("math type 9 is not one cuDNN defines"), std::string::npos) << text;
  for (const auto& [direction, entry] : searched) EXPECT_NE(text.find(entry.first), std::string::npos) << direction;
  const auto again = read();
  ASSERT_EQ(again.size(), 3u);
  for (const auto& [direction, entry] : searched) {
    EXPECT_EQ(again.at(direction).second.algo, entry.second.algo) << direction;
    EXPECT_EQ(again.at(direction).second.workspace, entry.second.workspace) << direction;
    EXPECT_EQ(again.at(direction).second.math_type, entry.second.math_type) << direction;
  }
  // A valid cache is used without a word.
  LogCapture quiet;
  ASSERT_NE(make_cuda_backend(o)->make_conv2d(d), nullptr);
  EXPECT_EQ(quiet.text().find("searched again"), std::string::npos) << quiet.text();
  std::filesystem::remove_all(dir);
}

// cuDNN's measured search allocates and waits: during a stream capture it fails and the
// capture is invalidated, as on a GPU.
TEST(CudaEmulationOnCpu, AConvolutionSearchDuringACaptureInvalidatesIt) {
  Streams s;
  cudnnHandle_t h = nullptr;
  ASSERT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&x), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateFilterDescriptor(&w), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 4, 4, 4), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 4, 4, 4), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 4, 4, 1, 1), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolution2dDescriptor(conv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_SUCCESS);
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  int got = 0;
  ASSERT_EQ(cudnnFindConvolutionForwardAlgorithm(h, x, w, conv, y, 8, &got, perf), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(got, 5);
  EXPECT_TRUE(cuda::cudnn_not_supported(perf[0].status)) << "for fp32 the half heuristics' first pick does not run";
  EXPECT_EQ(perf[1].status, CUDNN_STATUS_SUCCESS);
  EXPECT_TRUE(cuda::cudnn_not_supported(perf[4].status));

  ASSERT_EQ(cudaStreamBeginCapture(s.origin, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_NE(cudnnFindConvolutionForwardAlgorithm(h, x, w, conv, y, 8, &got, perf), CUDNN_STATUS_SUCCESS);
  const std::string e = last_error();
  EXPECT_NE(e.find("cudnnFindConvolutionForwardAlgorithm"), std::string::npos) << e;
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.origin, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroyFilterDescriptor(w);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroyTensorDescriptor(x);
  cudnnDestroy(h);
}

#ifdef RN_SIM_HAVE_NCCL
// Sink mode: a stop between two synchronisations reads the device's losses of the steps since
// the last read, so the stop's train record holds them (the host, eager:
// tests/train/stop_request_test.cpp).
TEST(CudaEmulationOnCpu, AStopInSinkModeRecordsTheLossesOfTheStepsSinceTheLastRead) {
  TestDir dir;
  auto config = [&](const std::string& name, int sink_size, int log_interval) {
    Config c = test::small_run_config(dir.file(name));  // 3 epochs of 4 steps of 8
    c.run.device = DeviceChoice::cuda;
    c.run.sink_size = sink_size;
    c.run.log_interval_steps = log_interval;
    c.data.workers = 0;
    c.validate();
    return c;
  };
  const TrainResult stopped = train(config("sink", 4, 50), test::stop_at_load(8 * 5 + 3));  // in step 6
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_EQ(stopped.steps, 6);
  const auto records = test::train_losses(stopped.run_dir);
  ASSERT_EQ(records.size(), 2u) << "epoch 1's last step and the stop";
  ASSERT_TRUE(records.count(4) && records.count(6));
  // Eager, a record every step (eager and sink mode train alike, bit for bit).
  const auto each = test::train_losses(test::train_until(config("eager", 0, 1), 6).run_dir);
  ASSERT_TRUE(each.count(5) && each.count(6));
  const double mean = (each.at(5) + each.at(6)) / 2;
  EXPECT_NEAR(records.at(6), mean, 1e-6 * std::abs(mean));
  EXPECT_NE(records.at(6), each.at(6));
}

// Eager device steps read their loss every step, and the loss-scale counters with it: a run
// whose every step overflows stops after precision.loss_scale.max_skips_in_a_row skips, not
// at the next log line.
TEST(CudaEmulationOnCpu, AnEagerDeviceRunStopsAtTheSkipLimitNotAtTheNextLogLine) {
  TestDir dir;
  Config cfg = test::small_run_config(dir.file("run"));
  cfg.run.device = DeviceChoice::cuda;
  cfg.precision.level = PrecisionLevel::O2;
  cfg.precision.half_dtype = DType::f16;
  cfg.precision.loss_scale.policy = LossScalePolicy::static_scale;
  cfg.precision.loss_scale.initial = 1e9;  // every fp16 step overflows
  cfg.precision.loss_scale.max_skips_in_a_row = 2;
  cfg.run.log_interval_steps = 50;
  cfg.validate();
  std::string e;
  try {
    train(cfg);
  } catch (const std::exception& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("2 steps in a row, up to step 2, were skipped"), std::string::npos) << e;
}
#endif

}  // namespace
}  // namespace rn
#endif

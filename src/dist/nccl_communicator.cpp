#include "dist/nccl_communicator.h"

#include "core/check.h"

#if RN_HAVE_NCCL
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "dist/mpi_communicator.h"
#endif

namespace rn {

#if RN_HAVE_NCCL

#define RN_NCCL_CUDA_CHECK(call)                                                                          \
  do {                                                                                                    \
    const cudaError_t rn_err_ = (call);                                                                   \
    RN_CHECK(rn_err_ == cudaSuccess) << #call << " failed: " << cudaGetErrorName(rn_err_) << ": "         \
                                     << cudaGetErrorString(rn_err_);                                      \
  } while (0)
#define RN_NCCL_CHECK(call)                                                                               \
  do {                                                                                                    \
    const ncclResult_t rn_res_ = (call);                                                                  \
    RN_CHECK(rn_res_ == ncclSuccess) << #call << " failed: " << ncclGetErrorString(rn_res_) << " ("       \
                                     << ncclGetLastError(nullptr) << ")";                                 \
  } while (0)

namespace {

ncclDataType_t nccl_type(ElemType t) {
  switch (t) {
    case ElemType::f32: return ncclFloat32;
    case ElemType::f64: return ncclFloat64;
    case ElemType::i32: return ncclInt32;
    case ElemType::i64: return ncclInt64;
    case ElemType::bf16: return ncclBfloat16;
    case ElemType::f16: return ncclFloat16;
  }
  return ncclFloat32;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& host, int device, void* compute_stream, double timeout_s)
      : host_(host), compute_(static_cast<cudaStream_t>(compute_stream)), timeout_s_(timeout_s) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    RN_CHECK(e == cudaSuccess && count > 0) << "NCCL communicator: no usable CUDA device ("
                                            << (e == cudaSuccess ? "none found" : cudaGetErrorString(e)) << ")";
    RN_CHECK(device >= 0 && device < count) << "NCCL communicator: device " << device << " of " << count;
    RN_NCCL_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    if (host.rank() == 0) RN_NCCL_CHECK(ncclGetUniqueId(&id));
    host.broadcast(&id, sizeof id, 0, "the NCCL unique id");
    init_under_deadline(id);
    RN_NCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RN_NCCL_CUDA_CHECK(cudaEventCreate(&mark_));
  }

  // A collective still in flight here (an exception unwinding mid-step, a peer that died)
  // may never finish, and ncclCommDestroy would wait for it: such a communicator is aborted.
  ~NcclCommunicator() override {
    bool in_flight = false;
    for (auto& [t, ev] : events_) {
      in_flight = in_flight || cudaEventQuery(ev.done) == cudaErrorNotReady;
      cudaEventDestroy(ev.done);
      if (ev.start) cudaEventDestroy(ev.start);
    }
    for (auto& [t, ev] : captured_)
      if (ev) cudaEventDestroy(ev);
    // A replayed graph may still run collectives: abort unless the compute stream is idle.
    in_flight = in_flight || cudaStreamQuery(compute_) == cudaErrorNotReady;
    cudaGetLastError();  // a query's error is not the next call's
    if (comm_) in_flight ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (mark_) cudaEventDestroy(mark_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return "nccl"; }
  std::vector<std::string> hosts() const override { return host_.hosts(); }

  // average is ncclAvg, which NCCL computes for floating-point types as a pre-multiplied
  // sum (each value times 1/size rounded to the type, then summed), so it may differ from a
  // host average in the last bits. Whether it scales before or after summing, an inf or NaN on any rank leaves a non-finite value at that element on every
  // rank (inf + x = inf, inf - inf = NaN, NaN + x = NaN), so the overflow check after a
  // gradient average skips the step on all ranks alike.
  Ticket all_reduce_async(void* data, int64_t count, ElemType type, ReduceOp op, const std::string& what) override {
    order_after_compute();  // while capturing: NCCL's stream joins the capture here
    const bool capture = capturing();
    cudaEvent_t start = nullptr;  // when the stream reached the collective (its inputs were ready)
    if (!capture) {
      RN_NCCL_CUDA_CHECK(cudaEventCreate(&start));
      RN_NCCL_CUDA_CHECK(cudaEventRecord(start, stream_));
    }
    RN_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                                op == ReduceOp::average ? ncclAvg : ncclSum, comm_, stream_));
    if (capture) return record_captured();
    return record(what, start);
  }

  bool capturable() const override { return true; }

  void wait_for_compute(const std::string& what) override {
    RN_CHECK(!capturing()) << "NCCL: waiting for " << what << " inside a CUDA graph capture";
    // The compute stream, then NCCL's (a collective that was never joined runs only there).
    for (cudaStream_t stream : {compute_, stream_}) {
      cudaEvent_t ev;
      RN_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      RN_NCCL_CUDA_CHECK(cudaEventRecord(ev, stream));
      poll(ev, what);
      cudaEventDestroy(ev);
    }
    // Everything issued before is done: release it.
    for (auto e = events_.begin(); e != events_.end();) {
      if (e->second.start) cudaEventDestroy(e->second.start);
      cudaEventDestroy(e->second.done);
      completed_ = std::max(completed_, e->first);
      e = events_.erase(e);
    }
  }

  CollectiveTiming wait(Ticket t) override {
    RN_CHECK(t <= issued_) << "wait for NCCL collective " << t << " that was never issued";
    if (captured_.count(t)) {
      // Captured in a step graph: it runs in the replays, which the compute stream orders.
      wait_for_compute("the replayed step's collectives");  // refused inside the capture
      return {};
    }
    if (t <= completed_) return {};  // waited for already (or an earlier collective's wait covered it)
    auto it = events_.find(t);
    RN_CHECK(it != events_.end()) << "wait for NCCL collective " << t << " that is unknown";
    const double t0 = now_s();
    poll(it->second.done, it->second.what);
    const CollectiveTiming timing{it->second.issued, now_s()};
    // Collectives finish in issue order on the one stream: every earlier event is done too.
    const bool marked = mark_done(t0);
    for (auto e = events_.begin(); e != events_.end() && e->first <= t;) {
      if (e->second.start) {
        keep_timing(e->first, e->second, marked);
        cudaEventDestroy(e->second.start);
      }
      cudaEventDestroy(e->second.done);
      e = events_.erase(e);
    }
    completed_ = t;
    return timing;
  }

  void mark_compute() override {
    if (capturing()) {  // replays are not timed
      marked_ = false;
      return;
    }
    RN_NCCL_CUDA_CHECK(cudaEventRecord(mark_, compute_));
    marked_ = true;
    timings_.clear();  // a new step: the last one's figures were handed out or are not wanted
  }

  std::optional<DeviceCollectiveTiming> device_timing(Ticket t) override {
    auto it = timings_.find(t);
    if (it == timings_.end()) return std::nullopt;
    const DeviceCollectiveTiming d = it->second;
    timings_.erase(it);
    return d;
  }

  // The compute stream waits for the collective on the device; the host does not. Its event
  // stays until wait() (the trainer waits before reading the step's loss, under the timeout).
  void join(Ticket t) override {
    RN_CHECK(t <= issued_) << "join NCCL collective " << t << " that was never issued";
    if (auto c = captured_.find(t); c != captured_.end()) {
      // Inside the capture: the compute stream waits for the collective in every replay.
      if (c->second) {
        RN_NCCL_CUDA_CHECK(cudaStreamWaitEvent(compute_, c->second, 0));
        cudaEventDestroy(c->second);  // the dependency is part of the graph now
        c->second = nullptr;
      }
      return;
    }
    if (t <= completed_) return;
    auto it = events_.find(t);
    RN_CHECK(it != events_.end()) << "join NCCL collective " << t << " that is unknown";
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    RN_CHECK(async == ncclSuccess) << "NCCL " << it->second.what << " on rank " << rank()
                                   << ": NCCL error: " << ncclGetErrorString(async);
    RN_NCCL_CUDA_CHECK(cudaStreamWaitEvent(compute_, it->second.done, 0));
  }

  void broadcast(void* data, int64_t bytes, int root, const std::string& what) override {
    RN_CHECK(!capturing()) << "NCCL broadcast of " << what << " inside a CUDA graph capture (it waits for itself)";
    order_after_compute();
    RN_NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
    wait(record(what));
  }
  void barrier(const std::string& what) override { host_.barrier(what); }
  std::vector<double> all_gather(double value, const std::string& what) override {
    return host_.all_gather(value, what);
  }

 private:
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    RN_NCCL_CUDA_CHECK(cudaStreamIsCapturing(compute_, &st));
    return st != cudaStreamCaptureStatusNone;  // an invalidated capture is still one
  }

  // ncclCommInitRank returns once every rank has joined, and never when one does not or the hosts
  // cannot reach each other over NCCL's network (a wrong NCCL_SOCKET_IFNAME, a firewall): after
  // the timeout the job ends, with every rank's last heartbeat.
  void init_under_deadline(const ncclUniqueId& id) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread watch([&] {
      std::unique_lock lk(mu);
      if (cv.wait_for(lk, std::chrono::duration<double>(timeout_s_), [&] { return done; })) return;
      abort_job(fmt::format("ncclCommInitRank on rank {} of {} has not returned after {:.0f} s (dist.timeout_s): a "
                            "rank has not joined, or the hosts cannot reach each other over NCCL's network (check "
                            "NCCL_SOCKET_IFNAME and NCCL_IB_HCA; NCCL_DEBUG=INFO shows what NCCL tried)",
                            host_.rank(), host_.size(), timeout_s_),
                1, /*with_status=*/true);
    });
    const ncclResult_t rc = ncclCommInitRank(&comm_, host_.size(), id, host_.rank());
    {
      std::lock_guard lk(mu);
      done = true;
    }
    cv.notify_all();
    watch.join();
    RN_CHECK(rc == ncclSuccess) << "ncclCommInitRank failed: " << ncclGetErrorString(rc) << " ("
                                << ncclGetLastError(nullptr) << ")";
  }

  // Polls `ev` until it completes, under the timeout; a hang or an asynchronous NCCL error
  // aborts the communicator and ends the job, naming `what`.
  void poll(cudaEvent_t ev, const std::string& what) {
    const double t0 = now_s();
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      RN_CHECK(q == cudaErrorNotReady) << "NCCL " << what << ": " << cudaGetErrorString(q);
      cudaGetLastError();  // "not ready" must not reach the backend's next launch check
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess || now_s() - t0 > timeout_s_) {
        const std::string why = async != ncclSuccess ? std::string("NCCL error: ") + ncclGetErrorString(async)
                                                     : fmt::format("no completion after {:.1f} s", now_s() - t0);
        ncclCommAbort(comm_);
        comm_ = nullptr;
        abort_job(fmt::format("NCCL {} on rank {}: {}", what, rank(), why), 1, /*with_status=*/true);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // A collective issued inside a capture: its done event exists only to be joined within the
  // capture; the host never polls it (wait() polls the compute stream instead).
  Ticket record_captured() {
    cudaEvent_t done = nullptr;
    RN_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    RN_NCCL_CUDA_CHECK(cudaEventRecord(done, stream_));
    const Ticket t = ++issued_;
    captured_[t] = done;
    if (captured_.size() > 4096) {  // tickets of old captures (never joined again): forget them
      if (captured_.begin()->second) cudaEventDestroy(captured_.begin()->second);
      captured_.erase(captured_.begin());
    }
    return t;
  }

  void order_after_compute() {
    cudaEvent_t ev;
    RN_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    RN_NCCL_CUDA_CHECK(cudaEventRecord(ev, compute_));
    RN_NCCL_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev, 0));
    RN_NCCL_CUDA_CHECK(cudaEventDestroy(ev));  // released once the wait is satisfied
  }
  // `start`: a timing event recorded just before the collective (device_timing), or null.
  Ticket record(const std::string& what, cudaEvent_t start = nullptr) {
    Pending p;
    p.what = what;
    p.issued = now_s();
    p.start = start;
    RN_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&p.done, start ? cudaEventDefault : cudaEventDisableTiming));
    RN_NCCL_CUDA_CHECK(cudaEventRecord(p.done, stream_));
    const Ticket t = ++issued_;
    events_[t] = p;
    return t;
  }

  struct Pending {
    cudaEvent_t done = nullptr, start = nullptr;
    std::string what;
    double issued = 0;
  };

  // Whether the last mark has been reached on the device, waiting for it (it precedes the
  // joins on the compute stream, so only backward's own kernels stand before it) under
  // the communicator's timeout, counted from `since`. No mark: false.
  bool mark_done(double since) {
    if (!marked_) return false;
    for (;;) {
      const cudaError_t q = cudaEventQuery(mark_);
      if (q == cudaSuccess) return true;
      cudaGetLastError();  // "not ready" must not reach the backend's next launch check
      if (q != cudaErrorNotReady || now_s() - since > timeout_s_)
        return false;  // untimed, not an error: the step's own checks report a failing device
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // A failed measurement leaves the collective untimed; its error must not reach the next
  // launch check (cudaGetLastError).
  void keep_timing(Ticket t, const Pending& p, bool marked) {
    float run_ms = 0, end_ms = 0;
    if (cudaEventElapsedTime(&run_ms, p.start, p.done) != cudaSuccess ||
        (marked && cudaEventElapsedTime(&end_ms, mark_, p.done) != cudaSuccess)) {
      cudaGetLastError();
      return;
    }
    if (!marked) return;
    if (timings_.size() >= 4096) timings_.erase(timings_.begin());  // never asked for: keep the newest
    timings_[t] = {1e-3 * run_ms, 1e-3 * end_ms};
  }
  Communicator& host_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  double timeout_s_;
  Ticket issued_ = 0, completed_ = 0;
  std::map<Ticket, Pending> events_;  // issued, not yet waited for; in issue order
  cudaEvent_t mark_ = nullptr;        // mark_compute(): the end of backward on the compute stream
  bool marked_ = false;
  std::map<Ticket, DeviceCollectiveTiming> timings_;  // done, measured, not yet handed out
  std::map<Ticket, cudaEvent_t> captured_;  // issued inside a graph capture; the event until joined
};

}  // namespace

bool nccl_available() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // major * 10000 + minor * 100 + patch since NCCL 2.9 (major * 1000 + ... before).
  const int major_unit = v >= 20900 ? 10000 : 1000;
  return std::to_string(v / major_unit) + "." + std::to_string(v % major_unit / 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device, void* compute_stream,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(host, device, compute_stream, timeout_s);
}

#else

bool nccl_available() { return false; }

std::string nccl_version() { return ""; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, void*, double) {
  RN_FAIL() << "this build has no NCCL (CUDA and NCCL were not found when it was configured)";
}

#endif

}  // namespace rn

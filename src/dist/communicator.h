// Collective communication between the ranks of a data-parallel job. One interface, three
// implementations: the local one (a single process with no launcher: world size 1, every
// collective a no-op that costs nothing), MPI for host buffers (dist/mpi_communicator.h)
// and NCCL for device buffers (dist/nccl_communicator.h, in CUDA builds).
//
// Every rank must issue the same collectives in the same order (MPI's rule). Collectives
// run in issue order; all_reduce_async() returns at once and the work overlaps whatever the
// caller does next (backward) until wait().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/build_info.h"

namespace rn {

enum class ReduceOp : uint8_t { sum, average };
enum class ElemType : uint8_t { f32, f64, i32, i64, bf16, f16 };
size_t elem_size(ElemType t);
const char* elem_name(ElemType t);

template <class T>
constexpr ElemType elem_type_of();
template <>
constexpr ElemType elem_type_of<float>() { return ElemType::f32; }
template <>
constexpr ElemType elem_type_of<double>() { return ElemType::f64; }
template <>
constexpr ElemType elem_type_of<int32_t>() { return ElemType::i32; }
template <>
constexpr ElemType elem_type_of<int64_t>() { return ElemType::i64; }

// Seconds a finished collective spent on the wire, for the report's hidden-communication
// share: from the moment it started (after everything issued before it) to its completion.
struct CollectiveTiming {
  double start = 0, end = 0;  // steady-clock seconds (trace_now_us() / 1e6 clock)
};

// What a device communicator measured of one collective on the device's clock (CUDA
// events): how long it ran on its stream, and when it ended relative to the last
// mark_compute() (negative: before the mark).
struct DeviceCollectiveTiming {
  double run_s = 0, end_after_mark_s = 0;
};

class Communicator {
 public:
  using Ticket = uint64_t;

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi", "nccl"
  // The host each rank runs on, by rank (for messages and the topology log).
  virtual std::vector<std::string> hosts() const = 0;

  // In place over all ranks; `what` names the data in timeout messages ("bucket 3").
  virtual Ticket all_reduce_async(void* data, int64_t count, ElemType type, ReduceOp op, const std::string& what) = 0;
  // Blocks until collective `t` (and every one issued before it) is done; rethrows its error.
  // Waiting again for a ticket already waited for returns at once.
  virtual CollectiveTiming wait(Ticket t) = 0;
  // Later work on the caller's compute stream waits for collective `t`, and the host goes
  // on at once (NCCL: an event wait queued on the compute stream). Host communicators have
  // no stream: the same as wait(). A joined collective may still be wait()ed for, which is
  // how the host learns of its completion, its error or its timeout.
  virtual void join(Ticket t) { wait(t); }
  // Device communicators: marks the point the compute stream has reached in the queue now
  // (the end of backward), for device_timing(). Host communicators: nothing.
  virtual void mark_compute() {}
  // Once collective t is done (after a wait() for it or a later one): its timing on the
  // device, handed out once. nullopt on host communicators (their wait() returns host
  // times) and when the device could not time it.
  virtual std::optional<DeviceCollectiveTiming> device_timing(Ticket) { return std::nullopt; }
  // Whether collectives issued while the compute stream is being captured into a CUDA graph
  // become part of the graph (NCCL), so that a replay of the graph runs them again. Such
  // captured collectives have tickets that join() orders after and wait() treats as
  // wait_for_compute(). Host communicators: false.
  virtual bool capturable() const { return false; }
  // Blocks until the compute stream has done everything queued on it so far (replayed
  // graphs and the collectives inside them), under the communicator's timeout; a hang or an
  // asynchronous communicator error ends the job like a hung wait(). Host communicators:
  // nothing to wait for.
  virtual void wait_for_compute(const std::string& /*what*/) {}

  void all_reduce(void* data, int64_t count, ElemType type, ReduceOp op, const std::string& what = "all-reduce") {
    wait(all_reduce_async(data, count, type, op, what));
  }
  template <class T>
  void all_reduce(T* data, int64_t count, ReduceOp op, const std::string& what = "all-reduce") {
    all_reduce(data, count, elem_type_of<T>(), op, what);
  }
  virtual void broadcast(void* data, int64_t bytes, int root, const std::string& what = "broadcast") = 0;
  virtual void barrier(const std::string& what = "barrier") = 0;
  // One value from every rank, by rank.
  virtual std::vector<double> all_gather(double value, const std::string& what = "all-gather") = 0;

  // Broadcasts a string from `root` (its length first).
  std::string broadcast_string(const std::string& s, int root, const std::string& what = "broadcast");
};

// World size 1, rank 0: collectives return at once and leave the data as it is.
std::unique_ptr<Communicator> make_local_communicator();

// The communication libraries of this build as they report themselves: MPI, and NCCL where
// built (core/build_info.h). Needs neither a running MPI job nor a GPU.
std::vector<LibraryVersion> communication_library_versions();

}  // namespace rn

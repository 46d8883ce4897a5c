// NCCL for the CPU emulation (sim.h): the calls src/dist/nccl_communicator.cpp makes, with
// the ranks of a communicator being the processes of an MPI job (one emulated device each).
// So a data-parallel job of resnet_sim under mpirun runs the NCCL communicator, the gradient
// buckets and their joins, and sink mode's collectives inside the step graph, on the CPU.
//
// A collective is work on its stream like a kernel's: it runs when something waits for the
// stream (sim.cpp, "deferred work"), or is recorded by a capture and runs at every replay,
// on the host thread that waits (so MPI runs at MPI_THREAD_MULTIPLE: the MPI communicator's
// own thread calls MPI meanwhile). It then meets the same collective of the
// other ranks through MPI (its own duplicate of MPI_COMM_WORLD): first a header (which
// collective, how many values of which type, which operation, whether this rank's device has
// failed), so that collectives that differ between ranks, which hang or corrupt on GPUs, stop
// every rank with an error naming both sides; then the data, all-gathered and reduced in rank
// order in double (integers exactly), so every rank holds the same bits.
//
// What a GPU's NCCL would refuse is refused too: a rank or size out of range, ranks that were
// given different unique ids (the id was not broadcast), two ranks on one device of one host,
// buffers that are not device memory, a stream of another device than the communicator's.
// Not modelled: NCCL's own reduction order and its fp16 sums (ours round once, from double),
// timing, and a peer that dies mid-collective (MPI, not NCCL's timeout, then ends the job).
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/sim/sim.h"
#include "core/dtype.h"

struct ncclComm {
  int rank = 0, nranks = 1, device = 0;
  MPI_Comm mpi = MPI_COMM_NULL;  // nranks > 1
  uint64_t collectives = 0;      // issued so far (the header's sequence number)
  ncclResult_t async = ncclSuccess;
  std::string error;  // what async is about
  bool aborted = false;  // ncclCommAbort: collectives still queued do nothing
};

namespace rn::cuda::sim {
namespace {

thread_local std::string t_last_error;

// The communicators, by handle: a queued collective holds its communicator too, so that
// ncclCommAbort may come before it runs (it then does nothing).
std::mutex g_comms_mutex;
std::map<ncclComm*, std::shared_ptr<ncclComm>> g_comms;

std::shared_ptr<ncclComm> handle_state(ncclComm_t handle) {
  const std::lock_guard lock(g_comms_mutex);
  const auto it = g_comms.find(handle);
  return it == g_comms.end() ? nullptr : it->second;
}

std::shared_ptr<ncclComm> forget(ncclComm_t handle) {
  const std::lock_guard lock(g_comms_mutex);
  const auto it = g_comms.find(handle);
  if (it == g_comms.end()) return nullptr;
  std::shared_ptr<ncclComm> c = std::move(it->second);
  g_comms.erase(it);
  return c;
}

ncclResult_t fail(ncclResult_t code, std::string message) {
  t_last_error = "NCCL emulation: " + std::move(message);
  return code;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* type_name(int t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    default: return "an unsupported type";
  }
}

const char* op_name(int op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "an unknown operation";
  }
}

bool is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

double load_float(const unsigned char* p, ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: {
      f16_t h;
      std::memcpy(&h.bits, p, 2);
      return f16_to_f32(h);
    }
    case ncclBfloat16: {
      bf16_t h;
      std::memcpy(&h.bits, p, 2);
      return bf16_to_f32(h);
    }
    case ncclFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}

void store_float(unsigned char* p, ncclDataType_t t, double v) {
  switch (t) {
    case ncclFloat16: {
      const uint16_t b = f32_to_f16(static_cast<float>(v)).bits;
      std::memcpy(p, &b, 2);
      break;
    }
    case ncclBfloat16: {
      const uint16_t b = f32_to_bf16(static_cast<float>(v)).bits;
      std::memcpy(p, &b, 2);
      break;
    }
    case ncclFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    default: std::memcpy(p, &v, 8);
  }
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  if constexpr (std::is_integral_v<T>) {  // sums and products wrap, as on a GPU
    using U = std::make_unsigned_t<T>;
    if (op == ncclProd) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    if (op != ncclMax && op != ncclMin) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    if (op == ncclProd) return a * b;
    if (op != ncclMax && op != ncclMin) return a + b;  // sum, and avg before its division
  }
  return op == ncclMax ? std::max(a, b) : std::min(a, b);
}

template <typename T>
void reduce_ints(const unsigned char* gathered, size_t stride, int nranks, size_t n, ncclRedOp_t op,
                 unsigned char* out) {
  for (size_t i = 0; i < n; ++i) {
    T acc;
    std::memcpy(&acc, gathered + i * sizeof(T), sizeof(T));
    for (int r = 1; r < nranks; ++r) {
      T v;
      std::memcpy(&v, gathered + r * stride + i * sizeof(T), sizeof(T));
      acc = combine(acc, v, op);
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(nranks));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// `v` rounded to the element type `t`.
double round_to(double v, ncclDataType_t t) {
  unsigned char b[8];
  store_float(b, t, v);
  return load_float(b, t);
}

// Reduces `n` values of every rank's part of `gathered` (rank r's at r * stride) into `out`,
// in rank order. A NaN anywhere stays NaN for max and min too, as on a GPU. Floating-point
// types round as NCCL's kernels do: every sum in the element type, and the average as
// NCCL computes it for them (a pre-multiplied sum: each value times 1/nranks rounded to the
// type, then summed), not as a sum divided once. Integers sum, then divide.
void reduce(const unsigned char* gathered, size_t stride, int nranks, size_t n, ncclDataType_t t, ncclRedOp_t op,
            unsigned char* out) {
  const size_t es = type_size(t);
  if (is_float(t)) {
    const bool avg = op == ncclAvg;
    const double scale = avg ? round_to(1.0 / nranks, t) : 1.0;
    const ncclRedOp_t each = avg ? ncclSum : op;
    const auto value = [&](int r, size_t i) {
      const double v = load_float(gathered + static_cast<size_t>(r) * stride + i * es, t);
      return avg ? round_to(v * scale, t) : v;
    };
    for (size_t i = 0; i < n; ++i) {
      double acc = value(0, i);
      for (int r = 1; r < nranks; ++r) {
        const double v = value(r, i);
        acc = std::isnan(v) || std::isnan(acc) ? std::numeric_limits<double>::quiet_NaN()
                                               : round_to(combine(acc, v, each), t);
      }
      store_float(out + i * es, t, acc);
    }
    return;
  }
  switch (t) {
    case ncclInt8: reduce_ints<int8_t>(gathered, stride, nranks, n, op, out); break;
    case ncclUint8: reduce_ints<uint8_t>(gathered, stride, nranks, n, op, out); break;
    case ncclInt32: reduce_ints<int32_t>(gathered, stride, nranks, n, op, out); break;
    case ncclUint32: reduce_ints<uint32_t>(gathered, stride, nranks, n, op, out); break;
    case ncclInt64: reduce_ints<int64_t>(gathered, stride, nranks, n, op, out); break;
    default: reduce_ints<uint64_t>(gathered, stride, nranks, n, op, out); break;
  }
}

enum Kind : int32_t { kAllReduce = 1, kBroadcast = 2 };

// What every rank says about the collective it runs, checked against the others'.
struct Header {
  uint64_t sequence = 0, count = 0;
  int32_t kind = 0, type = 0, op_or_root = 0;
  int32_t failed = 0;  // this rank's device has a sticky error: it runs nothing more
};

std::string describe(const Header& h) {
  std::string s = h.kind == kAllReduce ? "ncclAllReduce" : "ncclBroadcast";
  s += " #" + std::to_string(h.sequence) + " of " + std::to_string(h.count) + " " + type_name(h.type) + " values";
  s += h.kind == kAllReduce ? std::string(" (") + op_name(h.op_or_root) + ")"
                            : " from rank " + std::to_string(h.op_or_root);
  return s;
}

constexpr size_t kChunkBytes = size_t{64} << 20;  // per rank and MPI call (MPI counts are int)

// The collective itself, when the stream reaches it. Every rank exchanges its header even
// when its device has failed, so that no rank waits for data that never comes.
void run_collective(const std::shared_ptr<ncclComm>& comm, Header h, const void* send, void* recv) {
  if (comm->aborted || comm->async != ncclSuccess) return;  // a failed communicator runs nothing more
  h.failed = device_failed();
  std::vector<Header> all(static_cast<size_t>(comm->nranks));
  if (comm->nranks > 1) {
    MPI_Allgather(&h, sizeof h, MPI_BYTE, all.data(), sizeof h, MPI_BYTE, comm->mpi);
  } else {
    all[0] = h;
  }
  for (int r = 0; r < comm->nranks; ++r) {
    const Header& o = all[static_cast<size_t>(r)];
    if (o.failed) {
      comm->async = ncclRemoteError;
      comm->error = "rank " + std::to_string(r) + " failed before " + describe(h);
      // As on a GPU, the collective never completes: this device stops too.
      set_error(cudaErrorLaunchFailure, "NCCL emulation: " + comm->error, true);
      return;
    }
    if (o.kind != h.kind || o.count != h.count || o.type != h.type || o.op_or_root != h.op_or_root ||
        o.sequence != h.sequence) {
      comm->async = ncclInvalidUsage;
      comm->error = "rank " + std::to_string(comm->rank) + " ran " + describe(h) + " while rank " + std::to_string(r) +
                    " ran " + describe(o) + ": the ranks' collectives must match one for one (on GPUs they hang)";
      set_error(cudaErrorLaunchFailure, "NCCL emulation: " + comm->error, true);
      return;
    }
  }
  const auto type = static_cast<ncclDataType_t>(h.type);
  const size_t es = type_size(type);
  const size_t bytes = h.count * es;
  if (h.kind == kBroadcast) {
    if (comm->rank == h.op_or_root && send != recv && bytes) std::memmove(recv, send, bytes);
    for (size_t off = 0; comm->nranks > 1 && off < bytes; off += kChunkBytes)
      MPI_Bcast(static_cast<unsigned char*>(recv) + off, static_cast<int>(std::min(kChunkBytes, bytes - off)),
                MPI_BYTE, h.op_or_root, comm->mpi);
    return;
  }
  const size_t chunk = kChunkBytes / es * es;
  std::vector<unsigned char> gathered;
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    gathered.resize(n * static_cast<size_t>(comm->nranks));
    const auto* in = static_cast<const unsigned char*>(send) + off;
    if (comm->nranks > 1)
      MPI_Allgather(in, static_cast<int>(n), MPI_BYTE, gathered.data(), static_cast<int>(n), MPI_BYTE, comm->mpi);
    else
      std::memcpy(gathered.data(), in, n);
    reduce(gathered.data(), n, comm->nranks, n / es, type, static_cast<ncclRedOp_t>(h.op_or_root),
           static_cast<unsigned char*>(recv) + off);
  }
}

// Checks one collective as NCCL would and queues it on `stream`; op_or_root is the reduction
// of an all-reduce, the root of a broadcast.
ncclResult_t enqueue(ncclComm_t handle, int32_t kind, size_t count, ncclDataType_t type, int32_t op_or_root,
                     const void* send, void* recv, cudaStream_t stream) {
  Header h;
  h.kind = kind;
  h.count = count;
  h.type = type;
  h.op_or_root = op_or_root;
  const char* call = kind == kAllReduce ? "ncclAllReduce" : "ncclBroadcast";
  if (!handle) return fail(ncclInvalidArgument, std::string(call) + ": a null communicator");
  const std::shared_ptr<ncclComm> comm = handle_state(handle);
  if (!comm) return fail(ncclInvalidArgument, std::string(call) + ": a communicator that was destroyed or never made");
  const size_t es = type_size(static_cast<ncclDataType_t>(h.type));
  if (!es || h.type == ncclFloat8e4m3 || h.type == ncclFloat8e5m2)
    return fail(ncclInvalidArgument, std::string(call) + ": " + type_name(h.type) + " is not emulated");
  if (h.kind == kAllReduce && (h.op_or_root < ncclSum || h.op_or_root > ncclAvg))
    return fail(ncclInvalidArgument, std::string(call) + ": reduction " + op_name(h.op_or_root) + " of " +
                                         type_name(h.type) + " values");
  if (h.kind == kBroadcast && (h.op_or_root < 0 || h.op_or_root >= comm->nranks))
    return fail(ncclInvalidArgument, std::string(call) + ": root " + std::to_string(h.op_or_root) + " of " +
                                         std::to_string(comm->nranks) + " ranks");
  const size_t bytes = h.count * es;
  const bool sends = h.kind == kAllReduce || comm->rank == h.op_or_root;
  if (bytes && ((sends && !is_allocated(send, bytes)) || !is_allocated(recv, bytes)))
    return fail(ncclInvalidArgument, std::string(call) + ": a buffer of " + std::to_string(bytes) +
                                         " bytes that is not device memory from cudaMalloc");
  if (stream_device(stream) != comm->device)
    return fail(ncclInvalidUsage, std::string(call) + ": a stream of device " + std::to_string(stream_device(stream)) +
                                      " for a communicator of device " + std::to_string(comm->device));
  if (comm->async != ncclSuccess) return fail(comm->async, comm->error);
  h.sequence = ++comm->collectives;
  const auto op = [comm, h, send, recv] { run_collective(comm, h, send, recv); };
  submit(stream, op, call);
  return ncclSuccess;
}

}  // namespace
}  // namespace rn::cuda::sim

extern "C" {

// The emulation calls MPI from the threads that wait for collectives (dist/mpi_communicator.h).
int rn_mpi_thread_level_wanted() { return MPI_THREAD_MULTIPLE; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return rn::cuda::sim::fail(ncclInvalidArgument, "ncclGetUniqueId: a null id");
  std::memset(id, 0, sizeof *id);
  std::random_device rd;
  const std::string tag = "rn-sim nccl id of pid " + std::to_string(getpid()) + " " + std::to_string(rd());
  std::memcpy(id->internal, tag.data(), std::min(tag.size(), sizeof id->internal));
  return ncclSuccess;
}

// Every rank of an MPI job calls it with the same id (collective, as NCCL's is).
ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  using rn::cuda::sim::fail;
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: a null communicator pointer");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  auto comm = std::make_shared<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->device = rn::cuda::sim::current_device();
  if (nranks > 1) {
    int initialised = 0, finalised = 0, world_rank = 0, world_size = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised)
      return fail(ncclInvalidUsage, "ncclCommInitRank: " + std::to_string(nranks) +
                                        " ranks, and the emulation joins ranks through MPI, which is not running "
                                        "(start the job under mpirun)");
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      return fail(ncclInvalidUsage, "ncclCommInitRank: MPI runs at thread level " + std::to_string(level) +
                                        "; the emulation's collectives call MPI from the thread that waits for "
                                        "them, beside the MPI communicator's: it needs MPI_THREAD_MULTIPLE");
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_rank != rank || world_size != nranks)
      return fail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                        std::to_string(nranks) + ", and the emulation's communicators are "
                                        "MPI_COMM_WORLD's ranks (this is rank " + std::to_string(world_rank) +
                                        " of " + std::to_string(world_size) + ")");
    MPI_Comm_dup(MPI_COMM_WORLD, &comm->mpi);
    // Each rank's id, host and device: the same id everywhere, one device per rank and host.
    struct Who {
      ncclUniqueId id;
      char host[64];
      int32_t device;
    } me{}, none{};
    me.id = id;
    gethostname(me.host, sizeof me.host - 1);
    me.device = comm->device;
    std::vector<Who> all(static_cast<size_t>(nranks), none);
    MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, comm->mpi);
    for (int r = 0; r < nranks; ++r) {
      const Who& w = all[static_cast<size_t>(r)];
      if (std::memcmp(&w.id, &all[0].id, sizeof w.id) != 0) {
        MPI_Comm_free(&comm->mpi);
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(r) +
                                             " was given another unique id than rank 0 (rank 0's id must be "
                                             "broadcast to every rank)");
      }
      for (int q = 0; q < r; ++q)
        if (all[static_cast<size_t>(q)].device == w.device &&
            std::strncmp(all[static_cast<size_t>(q)].host, w.host, sizeof w.host) == 0) {
          MPI_Comm_free(&comm->mpi);
          return fail(ncclInvalidUsage, "ncclCommInitRank: ranks " + std::to_string(q) + " and " + std::to_string(r) +
                                            " both use device " + std::to_string(w.device) + " of host " + w.host +
                                            " (NCCL refuses a communicator with one GPU twice)");
        }
    }
  }
  const std::lock_guard lock(rn::cuda::sim::g_comms_mutex);
  rn::cuda::sim::g_comms[comm.get()] = comm;
  *out = comm.get();
  return ncclSuccess;
}

// Waits for the collectives queued so far, as NCCL's does.
ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  if (!handle) return ncclSuccess;
  rn::cuda::sim::drain_streams(/*blocking_only=*/false);
  const std::shared_ptr<ncclComm> comm = rn::cuda::sim::forget(handle);
  if (!comm) return rn::cuda::sim::fail(ncclInvalidArgument, "ncclCommDestroy: an unknown communicator");
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (comm->mpi != MPI_COMM_NULL && !finalised) MPI_Comm_free(&comm->mpi);
  return ncclSuccess;
}

// Collectives still queued do nothing. A peer may be gone: the duplicate MPI communicator
// is left to MPI's end.
ncclResult_t ncclCommAbort(ncclComm_t handle) {
  if (const std::shared_ptr<ncclComm> comm = rn::cuda::sim::forget(handle)) comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* error) {
  const std::shared_ptr<ncclComm> comm = rn::cuda::sim::handle_state(handle);
  if (!comm || !error) return ncclInvalidArgument;
  *error = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return rn::cuda::sim::enqueue(comm, rn::cuda::sim::kAllReduce, count, type, op, send, recv, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return rn::cuda::sim::enqueue(comm, rn::cuda::sim::kBroadcast, count, type, root, send, recv, stream);
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return rn::cuda::sim::fail(ncclInvalidArgument, "ncclGetVersion: a null pointer");
  *version = NCCL_VERSION_CODE;  // the version of the nccl.h the emulation was built against
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t handle) {
  const std::shared_ptr<ncclComm> comm = rn::cuda::sim::handle_state(handle);
  if (comm && comm->async != ncclSuccess) return comm->error.c_str();
  return rn::cuda::sim::t_last_error.c_str();
}

}  // extern "C"

// The NCCL communicator: all-reduce and broadcast of device buffers between GPUs, on its
// own CUDA stream, ordered after the compute stream's work at the moment a collective is
// issued (so a gradient bucket's all-reduce starts when backward has written it, and the
// compute stream runs on). Set up through the host communicator: rank 0 makes the NCCL
// unique id and broadcasts it. wait() polls the collective's event under the same timeout
// as the MPI communicator and, past it, aborts the NCCL communicator and ends the job with a
// message naming the collective. Built when CUDA and NCCL are found (RN_HAVE_NCCL).
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace rn {

// True in builds with NCCL.
bool nccl_available();
// The NCCL library loaded at run time, "2.28.9"; "" in builds without NCCL. Needs no GPU.
std::string nccl_version();

// `host`: the MPI (or local) communicator of the same ranks; `device`: this rank's GPU;
// `compute_stream`: the cudaStream_t backward runs on (nullptr: the legacy default stream).
// Throws rn::Error when the build has no NCCL, there is no usable GPU, or NCCL fails.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device, void* compute_stream,
                                                     double timeout_s);

}  // namespace rn

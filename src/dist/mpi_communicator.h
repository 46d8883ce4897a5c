// The MPI communicator: host buffers, started by mpirun / srun (Debian's OpenMPI).
//
// All MPI calls happen on one communication thread owned by this object (MPI is
// initialised there, at MPI_THREAD_FUNNELED), so the trainer's threads never enter MPI and
// collectives overlap backward. Collectives are non-blocking MPI calls polled by that
// thread, which meanwhile exchanges heartbeats (every rank -> rank 0 and rank 0 -> every
// rank: step, activity, collectives issued and done) and watches for failures:
//  * a collective that has not finished after `timeout_s` (rank 0) or timeout_s plus a
//    grace period (other ranks, so that rank 0, which knows most, speaks first);
//  * a rank whose heartbeat has been silent for `timeout_s` (stopped, hung in the kernel,
//    or gone);
//  * an MPI error.
// Each ends the whole job with MPI_Abort after logging one message that names the rank at
// fault, its host and what it was doing. A rank that dies outright is also seen by mpirun,
// which ends the job at once.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace rn {

// The MPI thread support this process asks for (an MPI_THREAD_* value): MPI_THREAD_FUNNELED,
// since only the communicator's thread calls MPI. A program that calls MPI from other
// threads too defines its own (the CUDA emulation's NCCL, src/backends/cuda/sim, asks for
// MPI_THREAD_MULTIPLE); this one is a weak definition.
extern "C" int rn_mpi_thread_level_wanted();

struct MpiOptions {
  double timeout_s = 300;    // see above
  double heartbeat_s = 1.0;  // heartbeat period
};

// The rank an MPI launcher (OpenMPI's mpirun, PMIx or PMI: srun) gave this process, read
// from its environment before MPI starts; -1 when no launcher started it.
int launcher_rank();
bool launched_by_mpi();  // launcher_rank() >= 0

// MPI_Init on the communication thread. Throws rn::Error when MPI cannot start.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options);

// Ends every rank of the job: logs `message` (naming this rank) and calls MPI_Abort on
// the communication thread of the live MPI communicator, or exits the process when there is
// none. Safe from any thread; does not return. `with_status` adds every rank's last known state
// (step, activity, collectives), as the watchdog's own messages have, for a wait that timed out
// outside MPI (an NCCL collective) where that tells which rank is elsewhere.
[[noreturn]] void abort_job(const std::string& message, int exit_code = 1, bool with_status = false);

}  // namespace rn

// Run under mpirun -np 2 with RN_SIM_DEVICES=2 by tests/dist/emulated_gpus_test.cpp: src/dist's
// NCCL communicator on emulated devices, where rank 1 is held up before it joins (its main thread
// elsewhere, its heartbeats going on). ncclCommInitRank waits for every rank and has no timeout
// of its own: rank 0 must end the job after dist.timeout_s, saying where rank 1 is.
// Prints "nccl_init_worker: FAILED ..." and exits 1 should a communicator be made.
#include <chrono>
#include <cstdio>
#include <thread>

#include "dist/activity.h"
#include "dist/nccl_communicator.h"
#include "dist/world.h"

int main() {
  using namespace rn;
  World& world = init_world({/*timeout_s=*/3, ""});
  if (world.rank == 1) {
    set_activity("loading the model", 0);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // rank 0 ends the job long before
  }
  set_activity("making the NCCL communicator", 0);
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(*world.comm, world.rank, nullptr, 3);
  std::fprintf(stderr, "nccl_init_worker: FAILED: rank %d made its communicator\n", world.rank);
  return 1;
}

// This process's place in a data-parallel job. Made once, at the start of `resnet train`
// (or a test): under an MPI launcher it starts MPI (after applying the rank table's network
// interface) and checks the rank table; with no launcher it is world size 1 with the local
// communicator, which costs nothing.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dist/communicator.h"
#include "dist/rank_table.h"

namespace rn {

struct WorldOptions {
  double timeout_s = 300;
  std::string rank_table;  // path; empty: $RN_RANK_TABLE (set by `resnet launch`), else the launcher's placement
  bool force_local = false;  // world size 1 even under a launcher (tests)
};

struct World {
  std::unique_ptr<Communicator> comm;  // host collectives (MPI or local)
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this host
  int device = 0;                      // the accelerator this rank uses (rank table, else local_rank)
  std::optional<RankTable> table;

  bool writer() const { return rank == 0; }  // only rank 0 writes logs, reports and checkpoints
  std::string describe() const;              // "rank 1 of 4 on node1 (local 1 of 2, device 1)"
};

// The process's world, set up on first call with `options` (later calls return it as is).
World& init_world(const WorldOptions& options);
// nullptr until init_world().
World* current_world();
// Ends MPI cleanly (every rank must call it); the world is gone afterwards.
void shutdown_world();

}  // namespace rn

#include "dist/world.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "dist/mpi_communicator.h"

namespace rn {
namespace {

std::unique_ptr<World> g_world;

}  // namespace

std::string World::describe() const {
  const std::string host = comm ? comm->hosts()[static_cast<size_t>(rank)] : local_hostname();
  return fmt::format("rank {} of {} on {} (local rank {} of {}, device {}; {} communicator)", rank, size, host,
                     local_rank, local_size, device, comm ? comm->name() : "no");
}

World& init_world(const WorldOptions& options) {
  if (g_world) return *g_world;
  auto w = std::make_unique<World>();
  std::optional<RankTable> table;
  std::string table_path = options.rank_table;
  if (const char* env = std::getenv("RN_RANK_TABLE"); table_path.empty() && env && *env) table_path = env;
  if (!table_path.empty()) table = load_rank_table(table_path);
  const bool mpi = launched_by_mpi() && !options.force_local;
  if (mpi) {
    // The rank table's network interface must be in the environment before MPI starts.
    if (table) {
      const int r = launcher_rank();
      if (r >= 0 && r < table->world_size()) {
        const std::string& iface = table->host_of(r).interface;
        if (!iface.empty()) {
          setenv("OMPI_MCA_btl_tcp_if_include", iface.c_str(), 0);
          setenv("NCCL_SOCKET_IFNAME", iface.c_str(), 0);
        }
      }
    }
    MpiOptions mo;
    mo.timeout_s = options.timeout_s;
    w->comm = make_mpi_communicator(mo);
  } else {
    w->comm = make_local_communicator();
  }
  w->rank = w->comm->rank();
  w->size = w->comm->size();
  const std::vector<std::string> hosts = w->comm->hosts();
  const std::string& me = hosts[static_cast<size_t>(w->rank)];
  w->local_rank = 0;
  w->local_size = 0;
  for (int r = 0; r < w->size; ++r) {
    if (hosts[static_cast<size_t>(r)] != me) continue;
    if (r < w->rank) ++w->local_rank;
    ++w->local_size;
  }
  w->device = w->local_rank;
  if (table && w->size == 1) {
    check_rank_placement(*table, w->rank, w->size, local_hostname(), local_addresses());
  } else if (table) {
    std::string misplaced;
    try {
      check_rank_placement(*table, w->rank, w->size, local_hostname(), local_addresses());
    } catch (const Error& e) {
      misplaced = e.what();
    }
    // Every rank learns whether any is misplaced before any goes on: rank 0 alone would
    // otherwise make the run folder (and its train.log) before another rank's abort ends it.
    const std::vector<double> failed = w->comm->all_gather(misplaced.empty() ? 0.0 : 1.0, "the rank placement check");
    const auto first = std::find(failed.begin(), failed.end(), 1.0);
    if (first != failed.end())
      abort_job(
          w->comm->broadcast_string(misplaced, static_cast<int>(first - failed.begin()), "the rank placement error"));
  }
  if (table) {
    w->device = table->ranks[static_cast<size_t>(w->rank)].device;
    w->table = std::move(table);
  }
  g_world = std::move(w);
  return *g_world;
}

World* current_world() { return g_world.get(); }

void shutdown_world() { g_world.reset(); }

}  // namespace rn

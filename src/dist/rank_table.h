// The rank table: which rank runs on which host and device, and which network interface
// the job's traffic uses, for when the launcher's defaults are not what the cluster needs.
//
//   {
//     "interface": "eth0",                       (optional: the default for every host)
//     "hosts": [ {"name": "node1", "address": "10.0.0.1", "interface": "ib0"},
//                {"name": "node2", "address": "10.0.0.2"} ],
//     "ranks": [ {"rank": 0, "host": "node1", "device": 0},
//                {"rank": 1, "host": "node1", "device": 1},
//                {"rank": 2, "host": "node2", "device": 0} ]
//   }
//
// "device" is optional: a rank without one takes its place among its host's ranks in rank
// order (the local rank). A host is matched by its name (the system host name) or its address (one of the
// machine's interface addresses). Mistakes are errors that say what is wrong: an unknown
// key, a rank naming an unknown host, two ranks on one device of one host, a duplicate or
// missing rank (ranks must be 0..N-1), a world size other than the launcher's, a rank
// started on a host other than its own. See docs/distributed.md.
#pragma once

#include <string>
#include <vector>

namespace rn {

struct RankTableHost {
  std::string name, address, interface;
};

struct RankTableEntry {
  int rank = 0;
  std::string host;  // a RankTableHost name
  int device = 0;    // as given, else the rank's place among its host's ranks
};

struct RankTable {
  std::string source;  // the file, for messages
  std::vector<RankTableHost> hosts;
  std::vector<RankTableEntry> ranks;  // sorted by rank, 0..N-1

  int world_size() const { return static_cast<int>(ranks.size()); }
  const RankTableHost& host_of(int rank) const;
  // The name mpirun should use for a host: its address when given, else its name.
  std::string launch_name(const RankTableHost& h) const { return h.address.empty() ? h.name : h.address; }
};

RankTable parse_rank_table(const std::string& json_text, const std::string& source);
RankTable load_rank_table(const std::string& path);

// Checks that `rank` of `world` belongs on this machine; throws naming the rank, its host
// in the table and the machine it runs on.
void check_rank_placement(const RankTable& t, int rank, int world, const std::string& hostname,
                          const std::vector<std::string>& local_addresses);

// This machine's host name and the IPv4/IPv6 addresses of its interfaces.
std::string local_hostname();
std::vector<std::string> local_addresses();

}  // namespace rn

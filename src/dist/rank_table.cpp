#include "dist/rank_table.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/json_util.h"
#include "core/utf8.h"

namespace rn {
namespace {

using nlohmann::json;

void check_keys(const json& j, const std::set<std::string>& allowed, const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key())) {
      std::string list;
      for (const std::string& k : allowed) list += (list.empty() ? "" : ", ") + k;
      RN_FAIL() << where << ": unknown key '" << it.key() << "' (expected: " << list << ")";
    }
  }
}

std::string get_string(const json& j, const char* key, const std::string& where, bool required) {
  if (!j.contains(key)) {
    RN_CHECK(!required) << where << ": missing \"" << key << "\"";
    return {};
  }
  RN_CHECK(j.at(key).is_string()) << where << ": \"" << key << "\" must be a string, not " << json_excerpt(j.at(key));
  return j.at(key).get<std::string>();
}

int get_int(const json& j, const char* key, const std::string& where) {
  RN_CHECK(j.contains(key)) << where << ": missing \"" << key << "\"";
  const json& v = j.at(key);
  const std::optional<int64_t> i = json_integer(v, 0, (1 << 30) - 1);
  RN_CHECK(i.has_value()) << where << ": \"" << key << "\" must be a non-negative integer, not " << json_excerpt(v);
  return static_cast<int>(*i);
}

}  // namespace

const RankTableHost& RankTable::host_of(int rank) const {
  RN_CHECK(rank >= 0 && rank < world_size()) << source << ": no rank " << rank;
  const std::string& name = ranks[static_cast<size_t>(rank)].host;
  for (const RankTableHost& h : hosts)
    if (h.name == name) return h;
  RN_FAIL() << source << ": rank " << rank << " names unknown host '" << name << "'";
}

RankTable parse_rank_table(const std::string& text, const std::string& source) {
  json j;
  std::string duplicate;
  try {
    j = parse_json_refusing_duplicates(text, duplicate);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number too large
    RN_FAIL() << "rank table " << source << ": not valid JSON: " << printable(e.what());
  }
  const std::string where = "rank table " + source;
  RN_CHECK(duplicate.empty()) << where << ": the key \"" << duplicate
                              << "\" is given twice in one object (which value is meant?)";
  RN_CHECK(j.is_object()) << where << ": the top level must be an object with \"hosts\" and \"ranks\"";
  check_keys(j, {"interface", "hosts", "ranks"}, where);
  RankTable t;
  t.source = source;
  const std::string default_iface = get_string(j, "interface", where, false);
  RN_CHECK(j.contains("hosts") && j["hosts"].is_array() && !j["hosts"].empty())
      << where << ": \"hosts\" must be a non-empty list";
  RN_CHECK(j.contains("ranks") && j["ranks"].is_array() && !j["ranks"].empty())
      << where << ": \"ranks\" must be a non-empty list";
  std::set<std::string> names, addresses;
  for (size_t i = 0; i < j["hosts"].size(); ++i) {
    const json& h = j["hosts"][i];
    const std::string hw = where + ": hosts[" + std::to_string(i) + "]";
    RN_CHECK(h.is_object()) << hw << ": must be an object with \"name\"";
    check_keys(h, {"name", "address", "interface"}, hw);
    RankTableHost host;
    host.name = get_string(h, "name", hw, true);
    RN_CHECK(!host.name.empty()) << hw << ": empty \"name\"";
    RN_CHECK(host.name.find_first_of(",: \t") == std::string::npos)
        << hw << ": host name '" << host.name << "' holds ',', ':' or a space, which mpirun's host list reads as "
        << "separators";
    host.address = get_string(h, "address", hw, false);
    host.interface = get_string(h, "interface", hw, false);
    if (host.interface.empty()) host.interface = default_iface;
    RN_CHECK(names.insert(host.name).second) << hw << ": host '" << host.name << "' is listed twice";
    if (!host.address.empty()) {
      RN_CHECK(host.address.find_first_of(",: \t") == std::string::npos)
          << hw << ": address '" << host.address << "' holds ',', ':' or a space, which mpirun's host list reads as "
          << "separators (an IPv6 address cannot be given there: use the host's name or an IPv4 address)";
      RN_CHECK(addresses.insert(host.address).second) << hw << ": address " << host.address << " is listed twice";
    }
    t.hosts.push_back(host);
  }
  // mpirun reaches each host by its address, else its name: one host's address that is another's
  // name (without an address) would start both hosts' ranks on one machine.
  for (const RankTableHost& h : t.hosts) {
    if (h.address.empty() || h.address == h.name) continue;
    for (const RankTableHost& o : t.hosts) {
      RN_CHECK(&o == &h || !o.address.empty() || o.name != h.address)
          << where << ": host '" << h.name << "' has the address " << h.address << ", which is host '" << o.name
          << "''s name: mpirun would start both hosts' ranks on one machine (give '" << o.name
          << "' its own \"address\", or correct the first)";
    }
  }
  std::map<int, RankTableEntry> by_rank;
  std::map<int, size_t> listed_at;  // rank -> its index in "ranks", for messages
  std::set<int> device_given;
  for (size_t i = 0; i < j["ranks"].size(); ++i) {
    const json& r = j["ranks"][i];
    const std::string rw = where + ": ranks[" + std::to_string(i) + "]";
    RN_CHECK(r.is_object()) << rw << ": must be an object with \"rank\", \"host\" and optionally \"device\"";
    check_keys(r, {"rank", "host", "device"}, rw);
    RankTableEntry e;
    e.rank = get_int(r, "rank", rw);
    e.host = get_string(r, "host", rw, true);
    RN_CHECK(names.count(e.host)) << rw << ": rank " << e.rank << " names unknown host '" << e.host
                                  << "' (hosts: " << [&] {
                                       std::string s;
                                       for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
                                       return s;
                                     }() << ")";
    RN_CHECK(!by_rank.count(e.rank)) << rw << ": rank " << e.rank << " is listed twice";
    if (r.contains("device")) {
      e.device = get_int(r, "device", rw);
      device_given.insert(e.rank);
    }
    by_rank[e.rank] = e;
    listed_at[e.rank] = i;
  }
  int expect = 0;
  for (const auto& [rank, e] : by_rank) {
    RN_CHECK(rank == expect) << where << ": ranks must be 0.." << by_rank.size() - 1 << " without gaps, but rank "
                             << expect << " is missing";
    ++expect;
  }
  // A rank without "device" takes its place among its host's ranks (in rank order): the
  // local rank, as a launcher without a table would give it.
  std::map<std::string, int> next_on_host;
  for (auto& [rank, e] : by_rank) {
    const int local = next_on_host[e.host]++;
    if (!device_given.count(rank)) e.device = local;
  }
  std::map<std::pair<std::string, int>, int> device_owner;
  for (const auto& [rank, e] : by_rank) {
    const std::string rw = where + ": ranks[" + std::to_string(listed_at[rank]) + "]";
    auto [it, fresh] = device_owner.insert({{e.host, e.device}, e.rank});
    auto how = [&](int r) {
      return device_given.count(r) ? "" : " (its place on the host, as no \"device\" is given)";
    };
    RN_CHECK(fresh) << rw << ": rank " << e.rank << " and rank " << it->second << " both use device " << e.device
                    << " of host '" << e.host << "'" << how(e.rank) << how(it->second)
                    << "; give each rank of a host its own \"device\"";
    t.ranks.push_back(e);
  }
  return t;
}

RankTable load_rank_table(const std::string& path) {
  std::error_code ec;
  RN_CHECK(!std::filesystem::is_directory(path, ec)) << "rank table '" << path << "' is a folder, not a JSON file";
  std::ifstream f(path);
  RN_CHECK(f) << "cannot open rank table '" << path << "'";
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_rank_table(ss.str(), path);
}

void check_rank_placement(const RankTable& t, int rank, int world, const std::string& hostname,
                          const std::vector<std::string>& local_addresses) {
  RN_CHECK(world == t.world_size()) << "rank table " << t.source << " has " << t.world_size()
                                    << " ranks but the launcher started " << world;
  const RankTableHost& h = t.host_of(rank);
  const bool by_name = h.name == hostname;
  const bool by_address =
      !h.address.empty() && std::find(local_addresses.begin(), local_addresses.end(), h.address) != local_addresses.end();
  const bool name_is_address =
      std::find(local_addresses.begin(), local_addresses.end(), h.name) != local_addresses.end();
  // "localhost" is whichever machine reads it: a table for one machine, which mpirun starts there.
  const bool loopback = h.name == "localhost" || h.name == "localhost.localdomain";
  const bool launched = std::getenv("RN_RANK_TABLE") != nullptr;  // by `resnet launch`
  RN_CHECK(by_name || by_address || name_is_address || loopback)
      << "rank table " << t.source << ": rank " << rank << " belongs on host '" << h.name << "'"
      << (h.address.empty() ? "" : " (" + h.address + ")") << " but was started on '" << hostname << "'"
      << (launched ? "; the table's name for this host is neither its host name (as `hostname` prints it) nor one "
                     "of its addresses: write one of those as \"name\", or the address as \"address\""
                   : "; launch with `resnet launch --rank-table " + t.source + "` or match the launcher's host list");
}

std::string local_hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::vector<std::string> local_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof buf);
    } else {
      continue;
    }
    out.emplace_back(buf);
  }
  freeifaddrs(list);
  return out;
}

}  // namespace rn

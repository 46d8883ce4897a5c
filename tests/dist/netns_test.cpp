// Two "hosts" on this machine: two network namespaces joined by a veth pair, made by the
// test (ip netns) and torn down after. `resnet launch` starts one rank in each through an
// rsh agent that enters the other namespace, with the rank table naming each host's
// address and interface, so the job's traffic really crosses an interface.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dist_test_util.h"
#include "train/metrics.h"

namespace rn {
namespace {

using namespace rn::test;

int sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string sh_out(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

class TwoHosts {
 public:
  TwoHosts() {
    const std::string id = std::to_string(getpid() % 100000);
    ns_a = "rn_a" + id;
    ns_b = "rn_b" + id;
    veth_a = "rnva" + id;
    veth_b = "rnvb" + id;
    if (geteuid() != 0) {
      why_not = "needs root (ip netns)";
      return;
    }
    if (sh("ip netns add " + ns_a) != 0 || sh("ip netns add " + ns_b) != 0) {
      why_not = "cannot create network namespaces here (ip netns add failed)";
      return;
    }
    const bool ok = sh("ip link add " + veth_a + " type veth peer name " + veth_b) == 0 &&
                    sh("ip link set " + veth_a + " netns " + ns_a) == 0 &&
                    sh("ip link set " + veth_b + " netns " + ns_b) == 0 &&
                    sh("ip -n " + ns_a + " addr add " + addr_a + "/24 dev " + veth_a) == 0 &&
                    sh("ip -n " + ns_b + " addr add " + addr_b + "/24 dev " + veth_b) == 0 &&
                    sh("ip -n " + ns_a + " link set " + veth_a + " up") == 0 &&
                    sh("ip -n " + ns_b + " link set " + veth_b + " up") == 0 &&
                    sh("ip -n " + ns_a + " link set lo up") == 0 && sh("ip -n " + ns_b + " link set lo up") == 0;
    if (!ok) why_not = "cannot make the veth pair between the namespaces";
  }
  ~TwoHosts() {
    sh("ip netns del " + ns_a);  // takes the veth pair with it
    sh("ip netns del " + ns_b);
  }
  int64_t tx_bytes_a() const {
    return std::atoll(sh_out("ip netns exec " + ns_a + " cat /sys/class/net/" + veth_a + "/statistics/tx_bytes").c_str());
  }
  std::string ns_a, ns_b, veth_a, veth_b;
  std::string addr_a = "10.77.0.1", addr_b = "10.77.0.2";
  std::string why_not;
};

TEST(DistTwoHosts, TrainingAcrossTwoNetworkNamespaces) {
  TwoHosts hosts;
  if (!hosts.why_not.empty()) GTEST_SKIP() << "two-host test skipped: " << hosts.why_not;
  const fs::path dir = fresh_dir("two_hosts");
  // mpirun runs in namespace A; this agent starts its daemon for host B inside namespace B.
  const fs::path agent = dir / "netns-agent.sh";
  std::ofstream(agent) << "#!/bin/sh\n"
                          "# rsh agent for the test hosts: AGENT HOST COMMAND... runs COMMAND in HOST's namespace\n"
                          "host=\"$1\"; shift\n"
                          "case \"$host\" in\n"
                       << "  " << hosts.addr_a << ") ns=" << hosts.ns_a << " ;;\n"
                       << "  " << hosts.addr_b << ") ns=" << hosts.ns_b << " ;;\n"
                       << "  *) echo \"unknown test host $host\" >&2; exit 1 ;;\n"
                          "esac\n"
                          "exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n";
  fs::permissions(agent, fs::perms::owner_all);
  std::ofstream(dir / "table.json") << R"({"hosts": [)"
                                    << R"({"name": "host-a", "address": ")" << hosts.addr_a << R"(", "interface": ")"
                                    << hosts.veth_a << R"("},)"
                                    << R"({"name": "host-b", "address": ")" << hosts.addr_b << R"(", "interface": ")"
                                    << hosts.veth_b << R"("}],)"
                                    << R"("ranks": [{"rank": 0, "host": "host-a"}, {"rank": 1, "host": "host-b"}]})";
  const int64_t tx0 = hosts.tx_bytes_a();
  const fs::path run_dir = dir / "run";
  std::vector<std::string> argv = {"ip", "netns", "exec", hosts.ns_a, resnet_binary(), "launch",
                                   "--rank-table", (dir / "table.json").string(),
                                   "--mpirun-arg=--mca", "--mpirun-arg=plm_rsh_agent", "--mpirun-arg=" + agent.string(),
                                   "--mpirun-arg=--mca", "--mpirun-arg=btl", "--mpirun-arg=tcp,self",
                                   "--", "train",
                                   "--set", "run.out_dir=" + run_dir.string(),
                                   "--set", "data.train_subset=320",
                                   "--set", "data.val_subset=200",
                                   "--set", "data.batch_size=16",
                                   "--set", "data.workers=1",
                                   "--set", "run.threads=1",
                                   "--set", "run.log_interval_steps=1",
                                   "--set", "schedule.epochs=1",
                                   "--set", "dist.timeout_s=60"};
  const RunResult r = run(argv, 600, dir / "out.log");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = read_all(run_dir / "train.log");
  EXPECT_NE(log.find("data-parallel over 2 ranks (mpi communicator, rank table"), std::string::npos) << log;
  // 10 steps, each all-reducing resnet20's 0.27 M fp32 gradients (~1.1 MB) over the veth.
  const int64_t sent = hosts.tx_bytes_a() - tx0;
  EXPECT_GT(sent, 10 * 1000000) << "bytes sent by host A over " << hosts.veth_a;
  int steps = 0;
  for (const auto& rec : read_metrics((run_dir / "metrics.jsonl").string())) steps += rec.value("kind", "") == "train";
  EXPECT_EQ(steps, 10);
}

}  // namespace
}  // namespace rn

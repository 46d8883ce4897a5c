// `resnet launch --rank-table T.json -- train ...`: starts a data-parallel job with mpirun,
// placing the ranks as the rank table says (hosts, ranks per host in rank order, the
// network interface) and handing the table to every rank, which checks its own place.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/check.h"
#include "dist/rank_table.h"

namespace rn::cli {
namespace {

struct LaunchArgs {
  std::string rank_table;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;
  bool dry_run = false;
  std::vector<std::string> command;
};

std::string self_exe() {
  char buf[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  RN_CHECK(n > 0) << "cannot find this program's path (/proc/self/exe)";
  return std::string(buf, static_cast<size_t>(n));
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,@+") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The mpirun command line for a rank table (tests see it through --dry-run).
std::vector<std::string> mpirun_command(const RankTable& t, const std::string& table_path, const LaunchArgs& a) {
  // mpirun fills hosts in the order given, so the ranks of one host must be consecutive.
  std::vector<std::pair<std::string, int>> hosts;  // launch name, ranks
  std::string iface;
  bool one_iface = true;
  for (int r = 0; r < t.world_size(); ++r) {
    const RankTableHost& h = t.host_of(r);
    const std::string name = t.launch_name(h);
    if (hosts.empty() || hosts.back().first != name) {
      for (const auto& [seen, n] : hosts)
        RN_CHECK(seen != name) << "rank table " << t.source << ": rank " << r << " is on host '" << h.name
                               << "' again after other hosts; number the ranks host by host for resnet launch";
      hosts.push_back({name, 0});
    }
    ++hosts.back().second;
    if (r == 0) iface = h.interface;
    if (h.interface != iface) one_iface = false;
  }
  std::vector<std::string> cmd = {a.mpirun, "-np", std::to_string(t.world_size())};
  std::string host_list;
  for (const auto& [name, n] : hosts) host_list += (host_list.empty() ? "" : ",") + fmt::format("{}:{}", name, n);
  cmd.insert(cmd.end(), {"--host", host_list, "--map-by", "slot"});
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (one_iface && !iface.empty())
    cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface});
  cmd.insert(cmd.end(), {"-x", "RN_RANK_TABLE=" + std::filesystem::absolute(table_path).string()});
  cmd.insert(cmd.end(), a.mpirun_args.begin(), a.mpirun_args.end());
  cmd.push_back(self_exe());
  cmd.insert(cmd.end(), a.command.begin(), a.command.end());
  return cmd;
}

}  // namespace

Runner add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("launch", "Start a data-parallel job with mpirun as a rank table places it");
  cmd->add_option("--rank-table", a->rank_table, "JSON rank table (docs/distributed.md)")->required();
  cmd->add_option("--mpirun", a->mpirun, "the mpirun program");
  cmd->add_option("--mpirun-arg", a->mpirun_args, "one more argument for mpirun (repeatable)")->allow_extra_args(false);
  cmd->add_flag("--dry-run", a->dry_run, "print the mpirun command instead of running it");
  cmd->add_option("command", a->command, "the resnet subcommand and its arguments, after --")->required();
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    const RankTable t = load_rank_table(a->rank_table);
    const std::vector<std::string> argv = mpirun_command(t, a->rank_table, *a);
    std::string line;
    for (const std::string& s : argv) line += (line.empty() ? "" : " ") + shell_quote(s);
    if (a->dry_run) {
      fmt::print("{}\n", line);
      return 0;
    }
    fmt::print(stderr, "resnet launch: {}\n", line);
    std::fflush(stderr);
    std::vector<char*> cargv;
    for (const std::string& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    RN_FAIL() << "cannot run " << a->mpirun << ": " << std::strerror(errno);
  };
}

}  // namespace rn::cli

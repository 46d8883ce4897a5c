// Helpers for tests that start MPI jobs: mpirun command lines that work as root and on a
// 2-core machine, running a command with a deadline, and finding one rank's process.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace rn::test {

namespace fs = std::filesystem;

inline const char* resnet_binary() { return RN_BINARY_DIR "/resnet"; }

inline fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(RN_BINARY_DIR) / "test_runs" / "dist" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline std::string read_all(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Under AddressSanitizer, spawn() starts jobs without its leak check: OpenMPI leaves
// allocations of its own (MCA components, op tables) at MPI_Finalize, which would fail every
// rank. mpirun and `resnet launch` pass the environment on to the ranks.
#if defined(__SANITIZE_ADDRESS__)
inline const char* kSanitizerEnv = "ASAN_OPTIONS=detect_leaks=0";
#else
inline const char* kSanitizerEnv = nullptr;
#endif

// mpirun -np N with what CI needs: root is allowed, more ranks than cores are allowed, and
// -x passes the marker that lets a test find the job's processes.
inline std::vector<std::string> mpirun(int ranks, const std::string& marker = "") {
  std::vector<std::string> a = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) a.push_back("--allow-run-as-root");
  if (!marker.empty()) {
    a.push_back("-x");
    a.push_back("RN_TEST_MARKER=" + marker);
  }
  return a;
}

// Starts argv with stdout and stderr appended to `log`, in its own process group.
inline pid_t spawn(const std::vector<std::string>& argv, const fs::path& log,
                   const std::vector<std::string>& env = {}) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "a");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    if (kSanitizerEnv && !getenv("ASAN_OPTIONS")) putenv(const_cast<char*>(kSanitizerEnv));
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

struct RunResult {
  int status = -1;       // exit status, 128 + signal, or -1 when the deadline passed
  double seconds = 0;
  std::string output;
};

// Waits for `pid` up to `deadline_s`; past it, kills the process group and returns -1.
inline RunResult wait_for(pid_t pid, double deadline_s, const fs::path& log) {
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (done == pid) {
      r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (r.seconds > deadline_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  r.output = read_all(log);
  return r;
}

inline RunResult run(const std::vector<std::string>& argv, double deadline_s, const fs::path& log,
                     const std::vector<std::string>& env = {}) {
  return wait_for(spawn(argv, log, env), deadline_s, log);
}

// The pid of the process whose environment holds RN_TEST_MARKER=marker and the given
// OMPI_COMM_WORLD_RANK, or -1.
inline pid_t find_rank(const std::string& marker, int rank) {
  DIR* d = opendir("/proc");
  if (!d) return -1;
  pid_t found = -1;
  const std::string want_marker = "RN_TEST_MARKER=" + marker;
  const std::string want_rank = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string env = read_all(fs::path("/proc") / e->d_name / "environ");
    bool has_marker = false, has_rank = false;
    size_t start = 0;
    while (start < env.size()) {
      size_t end = env.find('\0', start);
      if (end == std::string::npos) end = env.size();
      const std::string var = env.substr(start, end - start);
      has_marker = has_marker || var == want_marker;
      has_rank = has_rank || var == want_rank;
      start = end + 1;
    }
    // The rank's own process (not mpirun, which has no rank).
    if (has_marker && has_rank && read_all(fs::path("/proc") / e->d_name / "comm").rfind("resnet", 0) == 0) {
      found = pid;
      break;
    }
  }
  closedir(d);
  return found;
}

}  // namespace rn::test

// Test helper: runs the real `resnet` binary of this build in a child process, its stdout
// and stderr appended to a log file, and reads files back whole.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rn::test {

inline const char* resnet_path() { return RN_BINARY_DIR "/resnet"; }

// Starts `resnet args...`, output appended to `log`; returns the pid.
inline pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "a");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> argv{const_cast<char*>(resnet_path())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(resnet_path(), argv.data());
    _exit(127);
  }
  return pid;
}

// Its exit status, or 128 + the signal that ended it.
inline int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace rn::test

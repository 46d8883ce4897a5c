#include "train/run_folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/check.h"

namespace rn {
namespace {

std::string lock_path(const std::string& dir) { return dir + "/" + RunFolderLock::kFileName; }

// The pid the holder wrote, or "" if it cannot be read.
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& dir) {
  const std::string path = lock_path(dir);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  RN_CHECK(fd_ >= 0) << "cannot lock the run folder '" << dir << "': cannot open '" << path
                     << "': " << std::strerror(errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string pid = holder_of(fd_);
    ::close(fd_);
    fd_ = -1;
    RN_CHECK(err != EWOULDBLOCK) << "the run folder '" << dir << "' is in use by another resnet process"
                                 << (pid.empty() ? std::string() : " (pid " + pid + ")")
                                 << ": wait for it to end (or stop it with Ctrl-C) before resuming it, or name "
                                    "another run.out_dir";
    RN_FAIL() << "cannot lock the run folder '" << dir << "' (" << path << "): " << std::strerror(err);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // Best effort: the pid is for the message above only.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race a waiter)
}

bool RunFolderLock::held_by_another(const std::string& dir) {
  const int fd = ::open(lock_path(dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // drops the shared lock taken if it was free
  return held;
}

}  // namespace rn

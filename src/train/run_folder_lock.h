// One process at a time writes a run folder: an exclusive flock(2) on RUN/.lock, held for the
// life of the lock object (the kernel drops it when the process ends, however it ends), the
// file recording the holder's pid for the message another process gets. Two `resnet train`
// started with the same run.out_dir, or a `--resume` of a run that is still training, would
// otherwise delete each other's temporary checkpoint files and interleave their logs.
#pragma once

#include <string>

namespace rn {

class RunFolderLock {
 public:
  // Takes the lock of folder `dir` (which exists); throws rn::Error naming the folder and the
  // pid of the process that holds it.
  explicit RunFolderLock(const std::string& dir);
  ~RunFolderLock();
  RunFolderLock(RunFolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunFolderLock& operator=(RunFolderLock&&) = delete;
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  static constexpr const char* kFileName = ".lock";
  // Whether another process holds the lock of `dir` now.
  static bool held_by_another(const std::string& dir);

 private:
  int fd_ = -1;
};

}  // namespace rn

// Crash-safe file writing for checkpoints, the resolved config, reports and packed shards
// (core, so that data and train both use it): the bytes go
// to a temporary file in the destination's folder, are flushed and fsync'ed, and the file
// is renamed over the destination, whose folder is then fsync'ed. A reader (or a resumed
// run after a crash) sees either the old file or the complete new one, never a torn one.
// On any failure the temporary file is removed, the old file is left untouched, and the
// rn::Error names the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rn {

// Sequential writer handed to write_file_atomic's callback, so that large files (a
// checkpoint of every tensor) are streamed without first building one blob in memory.
class AtomicFileWriter {
 public:
  void write(const void* data, size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  uint64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }  // the destination, for messages

 private:
  friend void write_file_atomic(const std::string&, const std::function<void(AtomicFileWriter&)>&);
  AtomicFileWriter(std::FILE* file, std::string path, std::string temp_path)
      : file_(file), path_(std::move(path)), temp_path_(std::move(temp_path)) {}
  std::FILE* file_;
  std::string path_, temp_path_;
  uint64_t written_ = 0;
};

// Writes what `fill` writes to `path` atomically. If `fill` throws, the exception
// propagates after the temporary file is removed. A symbolic link at `path` is kept and its
// target replaced; a device or a pipe there (/dev/stdout, a FIFO) is written in place, which
// cannot be atomic.
void write_file_atomic(const std::string& path, const std::function<void(AtomicFileWriter&)>& fill);
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, std::string_view bytes);

// Where a write to `path` lands: `path` itself or, where it is a symbolic link (or a chain of
// them), the file it points to (which may not exist yet), so that a write keeps the link and
// replaces its target. Throws naming `path` for a loop of links.
std::string output_target(const std::string& path);
// Whether `path` (its links followed by the kernel, /dev/stdout's included) is an existing
// device, pipe or socket: such a target is written in place (a rename would destroy it).
bool is_special_file(const std::string& path);

// The whole file; errors name the path and the reason.
std::vector<uint8_t> read_file(const std::string& path);
std::string read_text_file(const std::string& path);

// fsyncs folder `dir` so that a rename into it survives a crash; `path` names the file
// for messages. File systems that cannot sync a folder are accepted.
void fsync_folder(const std::string& dir, const std::string& path);

}  // namespace rn

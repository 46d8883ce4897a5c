#include "core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace rn {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string folder_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// A name no other writer (thread or process) uses: the pid and a process-wide counter.
std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path p(path);
  std::string name = fmt::format(".{}.tmp.{}.{}", p.filename().string(), ::getpid(), counter.fetch_add(1));
  return (p.parent_path() / name).string();
}

// Owns the temporary file until it has been renamed into place.
struct TempFile {
  std::FILE* file = nullptr;
  std::string path;
  bool committed = false;
  ~TempFile() {
    if (file) std::fclose(file);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

void fsync_folder(const std::string& dir, const std::string& path) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  RN_CHECK(fd >= 0) << "wrote '" << path << "' but cannot open its folder '" << dir
                    << "' to sync it: " << errno_text(errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot sync a folder (EINVAL); the rename is still in place.
  RN_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP)
      << "wrote '" << path << "' but cannot sync its folder '" << dir << "': " << errno_text(err);
}

void AtomicFileWriter::write(const void* data, size_t size) {
  if (size == 0) return;
  size_t n = std::fwrite(data, 1, size, file_);
  RN_CHECK(n == size) << "cannot write '" << path_ << "' (temporary file '" << temp_path_
                      << "'): " << errno_text(errno);
  written_ += size;
}

std::string output_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  for (int links = 0; links < 40; ++links) {  // Linux's own limit
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
    const fs::path to = fs::read_symlink(p, ec);
    RN_CHECK(!ec) << "cannot write '" << path << "': cannot read the symbolic link '" << p.string()
                  << "': " << ec.message();
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  RN_FAIL() << "cannot write '" << path << "': too many levels of symbolic links";
}

bool is_special_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

void write_file_atomic(const std::string& path_in, const std::function<void(AtomicFileWriter&)>& fill) {
  RN_CHECK(!path_in.empty()) << "write_file_atomic: empty path";
  // A device or a pipe: written as it is (no temporary, rename or fsync). Asked of the path
  // as given, which the kernel resolves: /dev/stdout's /proc/self/fd/1 names a pipe as
  // "pipe:[N]", no path to follow by hand.
  if (is_special_file(path_in)) {
    const int fd = ::open(path_in.c_str(), O_WRONLY | O_CLOEXEC);
    RN_CHECK(fd >= 0) << "cannot write '" << path_in << "': " << errno_text(errno);
    std::FILE* f = ::fdopen(fd, "wb");
    if (f == nullptr) {
      const int err = errno;
      ::close(fd);
      RN_FAIL() << "cannot write '" << path_in << "': " << errno_text(err);
    }
    TempFile out;  // no path: closes the file on a throw, removes nothing
    out.file = f;
    AtomicFileWriter writer(f, path_in, path_in);
    fill(writer);
    RN_CHECK(std::fflush(f) == 0) << "cannot write '" << path_in << "': " << errno_text(errno);
    out.file = nullptr;
    RN_CHECK(std::fclose(f) == 0) << "cannot write '" << path_in << "': " << errno_text(errno);
    return;
  }
  const std::string path = output_target(path_in);
  const std::string dir = folder_of(path);
  TempFile temp;
  temp.path = temp_name_for(path);
  int fd = ::open(temp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    temp.path.clear();  // not ours to remove
    RN_FAIL() << "cannot write '" << path << "': cannot create a temporary file in '" << dir
              << "': " << errno_text(err);
  }
  // Keep the permissions of the file being replaced.
  struct stat old {};
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode)) ::fchmod(fd, old.st_mode & 07777);
  temp.file = ::fdopen(fd, "wb");
  if (temp.file == nullptr) {
    int err = errno;
    ::close(fd);
    RN_FAIL() << "cannot write '" << path << "': " << errno_text(err);
  }

  AtomicFileWriter writer(temp.file, path, temp.path);
  fill(writer);

  RN_CHECK(std::fflush(temp.file) == 0) << "cannot write '" << path << "': " << errno_text(errno);
  RN_CHECK(::fsync(::fileno(temp.file)) == 0) << "cannot sync '" << path << "': " << errno_text(errno);
  int rc = std::fclose(temp.file);
  temp.file = nullptr;
  RN_CHECK(rc == 0) << "cannot write '" << path << "': " << errno_text(errno);
  RN_CHECK(::rename(temp.path.c_str(), path.c_str()) == 0)
      << "cannot write '" << path << "': renaming the temporary file '" << temp.path
      << "' failed: " << errno_text(errno);
  temp.committed = true;
  fsync_folder(dir, path);
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  write_file_atomic(path, [&](AtomicFileWriter& w) { w.write(data, size); });
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, bytes.data(), bytes.size());
}

namespace {

template <class Bytes>
Bytes read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  RN_CHECK(f != nullptr) << "cannot read '" << path << "': " << errno_text(errno);
  Bytes out;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) out.insert(out.end(), chunk, chunk + n);
  bool failed = std::ferror(f) != 0;
  int err = errno;
  std::fclose(f);
  // Reading a folder fails here with EISDIR.
  RN_CHECK(!failed) << "cannot read '" << path << "': " << errno_text(err);
  return out;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) { return read_all<std::vector<uint8_t>>(path); }
std::string read_text_file(const std::string& path) { return read_all<std::string>(path); }

}  // namespace rn

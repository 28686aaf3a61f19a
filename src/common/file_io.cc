#include "relay/common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>

namespace relay {
namespace {

Status errno_status(int err, const std::string& what) { return absl::ErrnoToStatus(err, what); }

}  // namespace

StatusOr<std::string> read_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    if (errno == ENOENT) return NotFoundError(absl::StrCat(path, ": no such file"));
    return errno_status(errno, path + ": cannot open");
  }
  std::string text;
  char buf[1 << 14];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), file)) > 0) text.append(buf, n);
  const bool failed = std::ferror(file);
  std::fclose(file);
  if (failed) return DataLossError(path + ": read failed");
  return text;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

Status AtomicFile::open() {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return errno_status(errno, tmp_ + ": cannot create");
  return OkStatus();
}

Status AtomicFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {  // write(2) may stop short
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, tmp_ + ": write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

Status AtomicFile::commit() {
  if (::fsync(fd_) != 0) return errno_status(errno, tmp_ + ": fsync failed");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return errno_status(errno, tmp_ + ": close failed");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return errno_status(errno, tmp_ + ": rename to " + path_ + " failed");
  }
  committed_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return OkStatus();
}

Status write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  RELAY_RETURN_IF_ERROR(file.open());
  RELAY_RETURN_IF_ERROR(file.write(contents.data(), contents.size()));
  return file.commit();
}

}  // namespace relay

#pragma once

// Whole-file reads and crash-safe writes. Every file relay writes (weights,
// configs, tokenizers) goes through AtomicFile: the bytes go to PATH.tmp,
// which is fsynced and renamed over PATH, so PATH is always either the old
// file or the complete new one.

#include <cstddef>
#include <string>
#include <string_view>

#include "relay/common/status.h"

namespace relay {

// NotFound when the file does not exist; other errors name the path.
StatusOr<std::string> read_file(const std::string& path);

// Writes PATH.tmp and renames it over PATH on commit(); the temporary is
// removed if the object is destroyed before a successful commit().
// Not thread-safe; not copyable.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status open();
  Status write(const void* data, size_t n);
  // fsync, close, rename over PATH, then fsync the directory (best effort).
  Status commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// open + write + commit.
Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace relay

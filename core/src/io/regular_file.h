// Opening a file the user named for reading, refusing what is not a regular file before anything waits on it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

namespace latent {

// A read-only descriptor of a regular file, closed with the object.
struct RegularFile {
  int fd = -1;
  off_t size = 0;
  RegularFile() = default;
  RegularFile(RegularFile&& other) noexcept : fd(other.fd), size(other.size) { other.fd = -1; }
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();
};

// Opens `path` if it is a regular file (a symbolic link to one is). A FIFO, socket or device is refused at once:
// opening a FIFO for reading blocks until a writer comes, which would hang a pipeline's state change for good, so
// the open does not block and the type is checked before any read. Otherwise nothing, with `why` set ("cannot
// open: <errno text>", "not a regular file (a FIFO)", ...); each caller throws its own error type.
std::optional<RegularFile> open_regular_file(const std::filesystem::path& path, std::string& why);

}  // namespace latent

#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace latent {

RegularFile::~RegularFile() {
  if (fd >= 0) ::close(fd);
}

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a folder";
  return "not a file";
}

}  // namespace

std::optional<RegularFile> open_regular_file(const std::filesystem::path& path, std::string& why) {
  RegularFile file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0) {
    why = "cannot open: " + std::system_category().message(errno);
    return std::nullopt;
  }
  struct stat sb {};
  if (::fstat(file.fd, &sb) != 0) {
    why = "cannot stat: " + std::system_category().message(errno);
    return std::nullopt;
  }
  if (!S_ISREG(sb.st_mode)) {
    why = std::string("not a regular file (") + kind_of(sb.st_mode) + ")";
    return std::nullopt;
  }
  // Reads of a regular file never block, but the flag would be inherited by anything given the descriptor.
  ::fcntl(file.fd, F_SETFL, ::fcntl(file.fd, F_GETFL) & ~O_NONBLOCK);
  file.size = sb.st_size;
  return file;
}

}  // namespace latent

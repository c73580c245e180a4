#include "outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "io/json.h"

namespace latent::precompute {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string optional_text(const std::optional<double>& v) {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", *v);
  return buf;
}

// Letters, digits, '-', '_' and '.' of the video's stem, at most 48 of them: a name any filesystem takes.
std::string safe_stem(const std::string& source) {
  std::string stem = std::filesystem::path(source).stem().string(), out;
  for (char c : stem) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    out += ok ? c : '_';
    if (out.size() == 48) break;
  }
  return out.empty() ? "clip" : out;
}

}  // namespace

std::string clip_file_name(const ClipEntry& clip) {
  const std::string key =
      clip.source + '\n' + optional_text(clip.start) + '\n' + optional_text(clip.end) + '\n' + optional_text(clip.fps);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  return safe_stem(clip.source) + "-" + hex + ".safetensors";
}

bool owned_by(const ClipEntry& clip, uint64_t rank, uint64_t world) { return world <= 1 || clip.row % world == rank; }

JsonLines::JsonLines(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path.string() + ": cannot open for appending: " + std::strerror(errno));
  // A run killed mid-write left a line without its newline; ending it keeps the next line whole (the torn one
  // stays unparsable and is skipped by readers).
  const off_t size = ::lseek(fd_, 0, SEEK_END);
  char last = '\n';
  if (size > 0 && ::pread(fd_, &last, 1, size - 1) == 1 && last != '\n') append_raw("\n");
}

void JsonLines::append_raw(const std::string& text) {
  // A short write on a regular file means the disk is full or failing; a half line must not be followed by more.
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size()))
    throw std::runtime_error(path_.string() +
                             ": cannot append a line: " + (n < 0 ? std::strerror(errno) : std::string("short write")));
  if (::fsync(fd_) != 0) throw std::runtime_error(path_.string() + ": fsync failed: " + std::strerror(errno));
}

JsonLines::~JsonLines() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonLines::append(const std::string& object) { append_raw(object + "\n"); }

std::unordered_set<std::string> finished_files(const std::filesystem::path& index) {
  std::unordered_set<std::string> out;
  std::ifstream in(index);
  std::string line;
  while (std::getline(in, line)) {
    // getline also returns a last line that has no newline: one killed mid-write. It is not finished.
    if (in.eof()) break;
    try {
      const json::Value v = json::parse(line);
      if (const json::Value* f = v.find("latent_file"); f && f->is_string()) out.insert(f->as_string());
    } catch (const json::Error&) {
    }
  }
  return out;
}

}  // namespace latent::precompute

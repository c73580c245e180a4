#include "latent/io/safetensors.h"

#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <system_error>

namespace latent {
namespace {

std::string errno_text(int err) { return std::system_category().message(err); }

[[noreturn]] void io_fail(const std::filesystem::path& path, const std::string& what, int err) {
  throw SafetensorsError(path.string() + ": " + what + ": " + errno_text(err));
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void write_all_at(int fd, const void* data, size_t size, uint64_t offset, const std::filesystem::path& path) {
  auto p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd, p, size, off_t(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail(path, "write failed", errno);
    }
    p += n;
    size -= size_t(n);
    offset += uint64_t(n);
  }
}

void fsync_or_fail(int fd, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) io_fail(path, "fsync failed", errno);
}

void fsync_directory(const std::filesystem::path& dir) {
  Fd d(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0) ::fsync(d.fd);  // best effort: some filesystems refuse fsync on directories
}

uint64_t round_up8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

std::string header_block(const std::string& json, uint64_t n) {
  std::string block(8 + n, ' ');
  std::memcpy(block.data(), &n, 8);
  std::memcpy(block.data() + 8, json.data(), json.size());
  return block;
}

// Copies [from, from+size) of `src` to `dst` at `to`, in the kernel where it can.
void copy_range(int src, uint64_t from, int dst, uint64_t to, uint64_t size, const std::filesystem::path& path) {
  std::vector<char> buf;
  while (size > 0) {
    loff_t in = loff_t(from), out = loff_t(to);
    ssize_t n = ::copy_file_range(src, &in, dst, &out, size_t(std::min<uint64_t>(size, 1u << 30)), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (buf.empty()) buf.resize(1 << 20);
      ssize_t r = ::pread(src, buf.data(), std::min<uint64_t>(size, buf.size()), off_t(from));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) io_fail(path, "copy failed", r < 0 ? errno : EIO);
      write_all_at(dst, buf.data(), size_t(r), to, path);
      n = r;
    }
    from += uint64_t(n);
    to += uint64_t(n);
    size -= uint64_t(n);
  }
}

// Readable too: a header that outgrows its reserve is relocated by copying the data back out.
int create_exclusive(const std::filesystem::path& path) {
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
}

std::filesystem::path unique_temp_path(const std::filesystem::path& final_path, int* fd) {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", unsigned(rd()));
    auto temp = final_path.parent_path() / ("." + final_path.filename().string() + ".tmp-" + suffix);
    *fd = create_exclusive(temp);
    if (*fd >= 0) return temp;
    if (errno != EEXIST) io_fail(temp, "cannot create temporary file", errno);
  }
  throw SafetensorsError(final_path.string() + ": cannot find a free temporary file name");
}

}  // namespace

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(addr), size}; }
};

c10::ScalarType to_scalar_type(st::Dtype dtype) {
  using st::Dtype;
  switch (dtype) {
    case Dtype::BOOL: return c10::kBool;
    case Dtype::U8: return c10::kByte;
    case Dtype::I8: return c10::kChar;
    case Dtype::I16: return c10::kShort;
    case Dtype::U16: return c10::kUInt16;
    case Dtype::F16: return c10::kHalf;
    case Dtype::BF16: return c10::kBFloat16;
    case Dtype::I32: return c10::kInt;
    case Dtype::U32: return c10::kUInt32;
    case Dtype::F32: return c10::kFloat;
    case Dtype::F64: return c10::kDouble;
    case Dtype::I64: return c10::kLong;
    case Dtype::U64: return c10::kUInt64;
    case Dtype::C64: return c10::kComplexFloat;
    case Dtype::F8_E4M3: return c10::kFloat8_e4m3fn;
    case Dtype::F8_E5M2: return c10::kFloat8_e5m2;
    case Dtype::F8_E8M0: return c10::kFloat8_e8m0fnu;
  }
  throw SafetensorsError("unknown safetensors dtype");
}

st::Dtype to_safetensors_dtype(c10::ScalarType type) {
  using st::Dtype;
  switch (type) {
    case c10::kBool: return Dtype::BOOL;
    case c10::kByte: return Dtype::U8;
    case c10::kChar: return Dtype::I8;
    case c10::kShort: return Dtype::I16;
    case c10::kUInt16: return Dtype::U16;
    case c10::kHalf: return Dtype::F16;
    case c10::kBFloat16: return Dtype::BF16;
    case c10::kInt: return Dtype::I32;
    case c10::kUInt32: return Dtype::U32;
    case c10::kFloat: return Dtype::F32;
    case c10::kDouble: return Dtype::F64;
    case c10::kLong: return Dtype::I64;
    case c10::kUInt64: return Dtype::U64;
    case c10::kComplexFloat: return Dtype::C64;
    case c10::kFloat8_e4m3fn: return Dtype::F8_E4M3;
    case c10::kFloat8_e5m2: return Dtype::F8_E5M2;
    case c10::kFloat8_e8m0fnu: return Dtype::F8_E8M0;
    default: throw SafetensorsError(std::string("safetensors cannot store dtype ") + c10::toString(type));
  }
}

SafetensorsFile::SafetensorsFile(std::filesystem::path path, std::shared_ptr<Mapping> map, st::Header header)
    : path_(std::move(path)), map_(std::move(map)), header_(std::move(header)) {}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  std::string why;
  const std::optional<RegularFile> f = open_regular_file(path, why);
  if (!f) throw SafetensorsError(path.string() + ": " + why);
  if (f->size == 0) throw SafetensorsError(path.string() + ": empty file, not a safetensors file");
  auto map = std::make_shared<Mapping>();
  map->size = size_t(f->size);
  // Private and writable: tensors handed out may be modified in place without touching the file.
  void* addr = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
  if (addr == MAP_FAILED) io_fail(path, "cannot map", errno);
  map->addr = addr;
  st::Header header = st::parse(map->bytes(), path.string());
  return SafetensorsFile(path, std::move(map), std::move(header));
}

std::span<const std::byte> SafetensorsFile::mapping() const { return map_->bytes(); }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(header_.tensors.size());
  for (const auto& t : header_.tensors) out.push_back(t.name);
  return out;
}

const st::TensorEntry& SafetensorsFile::entry(std::string_view name) const {
  const st::TensorEntry* e = header_.find(name);
  if (!e) throw SafetensorsError(path_.string() + ": no tensor named '" + std::string(name) + "'");
  return *e;
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const st::TensorEntry& e = entry(name);
  return map_->bytes().subspan(header_.data_offset + e.begin, e.nbytes());
}

torch::Tensor SafetensorsFile::tensor(std::string_view name) const {
  const st::TensorEntry& e = entry(name);
  std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
  auto options = torch::TensorOptions().dtype(to_scalar_type(e.dtype)).device(torch::kCPU);
  if (e.nbytes() == 0) return torch::empty(shape, options);
  auto* data = const_cast<std::byte*>(bytes(name).data());
  if (reinterpret_cast<uintptr_t>(data) % st::dtype_size(e.dtype) == 0) {
    std::shared_ptr<Mapping> keep = map_;
    return torch::from_blob(
        data, shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  auto out = torch::empty(shape, options);
  std::memcpy(out.data_ptr(), data, e.nbytes());
  return out;
}

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, Options options)
    : path_(std::move(path)), options_(options) {
  if (path_.filename().empty()) throw SafetensorsError(path_.string() + ": not a file name");
  temp_path_ = unique_temp_path(path_, &fd_);
  reserved_ = round_up8(std::max<size_t>(options_.header_reserve, 8));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (state_ == State::open) abandon();
}

void SafetensorsWriter::require_open(const char* what) const {
  if (state_ != State::open) throw SafetensorsError(path_.string() + ": " + what + " after the writer finished");
}

void SafetensorsWriter::check_new_name(const std::string& name) const {
  if (name == "__metadata__") throw SafetensorsError(path_.string() + ": '__metadata__' is not a tensor name");
  if (names_.count(name)) throw SafetensorsError(path_.string() + ": tensor '" + name + "' written twice");
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  require_open("set_metadata");
  metadata_[key] = value;
}

void SafetensorsWriter::write_data(const void* data, size_t size) {
  write_all_at(fd_, data, size, 8 + reserved_ + cursor_, temp_path_);
  cursor_ += size;
}

torch::Tensor SafetensorsWriter::cpu_contiguous(const torch::Tensor& t) {
  if (!t.defined()) throw SafetensorsError("undefined tensor");
  return t.to(torch::kCPU).contiguous();
}

void SafetensorsWriter::write_bytes(const std::string& name, st::Dtype dtype, std::vector<uint64_t> shape,
                                    std::span<const std::byte> data) {
  require_open("write");
  check_new_name(name);
  st::TensorEntry e{name, dtype, std::move(shape), cursor_, cursor_ + data.size()};
  if (e.numel() * st::dtype_size(dtype) != data.size()) {
    throw SafetensorsError(path_.string() + ": tensor '" + name + "': " + std::to_string(data.size()) +
                           " bytes do not match its shape and dtype");
  }
  write_data(data.data(), data.size());
  names_.insert(e.name);
  entries_.push_back(std::move(e));
  appending_last_ = false;
}

void SafetensorsWriter::write(const std::string& name, const torch::Tensor& tensor) {
  auto t = cpu_contiguous(tensor);
  std::vector<uint64_t> shape(t.sizes().begin(), t.sizes().end());
  write_bytes(name, to_safetensors_dtype(t.scalar_type()), std::move(shape),
              {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()});
}

void SafetensorsWriter::append(const std::string& name, const torch::Tensor& rows) {
  require_open("append");
  auto t = cpu_contiguous(rows);
  if (t.dim() == 0) throw SafetensorsError(path_.string() + ": tensor '" + name + "': cannot append a scalar");
  st::Dtype dtype = to_safetensors_dtype(t.scalar_type());
  bool extend = appending_last_ && entries_.back().name == name;
  if (!extend) {
    check_new_name(name);
    std::vector<uint64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[0] = 0;
    names_.insert(name);
    entries_.push_back({name, dtype, std::move(shape), cursor_, cursor_});
    appending_last_ = true;
  }
  st::TensorEntry& e = entries_.back();
  std::vector<uint64_t> trailing(t.sizes().begin() + 1, t.sizes().end());
  if (e.dtype != dtype || !std::equal(trailing.begin(), trailing.end(), e.shape.begin() + 1, e.shape.end()) ||
      trailing.size() + 1 != e.shape.size()) {
    throw SafetensorsError(path_.string() + ": tensor '" + name + "': appended rows " + c10::str(t.sizes()) + " of " +
                           st::dtype_name(dtype) + " do not match the tensor's trailing shape or dtype " +
                           st::dtype_name(e.dtype));
  }
  write_data(t.data_ptr(), t.nbytes());
  e.shape[0] += uint64_t(t.size(0));
  e.end = cursor_;
}

void SafetensorsWriter::commit() {
  require_open("commit");
  std::string json = st::header_json(entries_, metadata_);
  if (json.size() > st::kMaxHeaderSize) throw SafetensorsError(path_.string() + ": header above the format's limit");
  int fd = fd_;
  std::filesystem::path written = temp_path_;
  if (json.size() <= reserved_) {
    std::string block = header_block(json, reserved_);
    write_all_at(fd_, block.data(), block.size(), 0, temp_path_);
  } else {
    // The reserve was too small: lay the file out again with the header first.
    int fd2 = -1;
    written = unique_temp_path(path_, &fd2);
    try {
      uint64_t n = round_up8(json.size());
      std::string block = header_block(json, n);
      write_all_at(fd2, block.data(), block.size(), 0, written);
      copy_range(fd_, 8 + reserved_, fd2, 8 + n, cursor_, written);
    } catch (...) {
      ::close(fd2);
      ::unlink(written.c_str());
      throw;
    }
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    fd_ = fd = fd2;
    temp_path_ = written;
  }
  if (options_.durable) fsync_or_fail(fd, written);
  if (::close(fd) != 0) {
    fd_ = -1;
    io_fail(written, "close failed", errno);
  }
  fd_ = -1;
  if (::rename(written.c_str(), path_.c_str()) != 0)
    io_fail(path_, "cannot rename the finished file into place", errno);
  if (options_.durable) fsync_directory(path_.parent_path());
  state_ = State::committed;
}

void SafetensorsWriter::commit_as(const std::filesystem::path& destination) {
  require_open("commit");
  path_ = destination;
  commit();
}

void SafetensorsWriter::abandon() {
  if (state_ != State::open) return;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
  state_ = State::abandoned;
}

}  // namespace latent

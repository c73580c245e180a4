// Reading and writing safetensors files as LibTorch tensors.
//
// The reader maps the file once and hands out CPU tensors that view the mapping without copying when the data
// is aligned for its dtype (a copy otherwise); each tensor keeps the mapping alive. The mapping is private
// copy-on-write, so writing into a returned tensor never changes the file.
//
// The writer streams tensor data to a temporary file next to the destination and renames it into place on
// commit(), so a crash or an abandoned writer never leaves a partial file under the final name.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "latent/io/safetensors_format.h"

namespace latent {

using SafetensorsError = st::FormatError;

c10::ScalarType to_scalar_type(st::Dtype dtype);
// Throws SafetensorsError for a LibTorch dtype the format cannot hold.
st::Dtype to_safetensors_dtype(c10::ScalarType type);

class SafetensorsFile {
 public:
  // Maps and validates the whole file; every defect throws SafetensorsError naming the file.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::vector<st::TensorEntry>& entries() const { return header_.tensors; }
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const { return header_.find(name) != nullptr; }
  // Throws SafetensorsError naming the file and the tensor when absent.
  const st::TensorEntry& entry(std::string_view name) const;

  std::span<const std::byte> bytes(std::string_view name) const;
  // A view into the mapping (no copy) when the tensor's offset suits its dtype's alignment; the mapping lives as
  // long as any tensor taken from it.
  torch::Tensor tensor(std::string_view name) const;
  // The whole mapped file.
  std::span<const std::byte> mapping() const;

 private:
  struct Mapping;
  SafetensorsFile(std::filesystem::path path, std::shared_ptr<Mapping> map, st::Header header);

  std::filesystem::path path_;
  std::shared_ptr<Mapping> map_;
  st::Header header_;
};

class SafetensorsWriter {
 public:
  struct Options {
    // Bytes kept for the header ahead of the data, so commit() normally writes it in place. A larger header
    // still works: commit() then rewrites the file once with the header moved ahead.
    size_t header_reserve = 16 * 1024;
    // fsync the file and its directory on commit; off only where durability does not matter (tests, scratch).
    bool durable = true;
  };

  explicit SafetensorsWriter(std::filesystem::path path) : SafetensorsWriter(std::move(path), Options{}) {}
  SafetensorsWriter(std::filesystem::path path, Options options);
  // Removes the temporary file unless commit() succeeded.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void set_metadata(const std::string& key, const std::string& value);

  // Writes a whole tensor (moved to the CPU and made contiguous if it is not).
  void write(const std::string& name, const torch::Tensor& tensor);
  // Grows tensor `name` along dim 0: the first call creates it, the next calls (with no other tensor written
  // in between) append rows of the same trailing shape and dtype. Lets a stream of frames land in one tensor.
  void append(const std::string& name, const torch::Tensor& rows);
  // The untyped form of write(), for data that is not in a tensor.
  void write_bytes(const std::string& name, st::Dtype dtype, std::vector<uint64_t> shape,
                   std::span<const std::byte> data);

  // Writes the header and moves the file to its final name. The writer is finished afterwards.
  void commit();
  // commit() under another name in the same folder, e.g. a ".partial" twin for data that is whole but not the
  // complete stream the final name promises.
  void commit_as(const std::filesystem::path& destination);
  // Drops everything written so far; the destination is left untouched.
  void abandon();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }
  uint64_t data_bytes() const { return cursor_; }
  bool committed() const { return state_ == State::committed; }

 private:
  enum class State { open, committed, abandoned };
  void require_open(const char* what) const;
  void check_new_name(const std::string& name) const;
  void write_data(const void* data, size_t size);
  static torch::Tensor cpu_contiguous(const torch::Tensor& t);

  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  Options options_;
  int fd_ = -1;
  uint64_t reserved_ = 0;  // N reserved at the start of the file
  uint64_t cursor_ = 0;    // bytes of data written
  std::vector<st::TensorEntry> entries_;
  std::unordered_set<std::string> names_;  // of entries_, so a writer of many tensors stays linear
  bool appending_last_ = false;            // the last entry was created by append() and may grow
  std::map<std::string, std::string> metadata_;
  State state_ = State::open;
};

}  // namespace latent

// The clips latent-precompute encodes: a CSV manifest read one record at a time (never loaded whole, so a
// manifest of millions of rows costs one row of memory), or the video files of a folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace latent::precompute {

// A manifest that cannot be read at all (no header, no `path` column): the run cannot start.
class ManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClipEntry {
  uint64_t row = 0;            // data record number from 0 (the header is not counted)
  std::filesystem::path path;  // resolved against the manifest's folder when relative
  std::string source;          // the path as the manifest wrote it
  std::string caption;
  std::optional<double> start, end;  // seconds
  std::optional<double> fps;
};

// One record that is not a clip; the run records it and goes on.
struct RowError {
  uint64_t row = 0;
  std::string reason;
};

using ManifestRow = std::variant<ClipEntry, RowError>;

// A record is at most 1 MiB (delimiters and quotes included) of at most 1024 fields: a caption dataset's longest
// rows are a few KiB, and the bound keeps one unclosed quote from reading the rest of a manifest into memory.
inline constexpr size_t kMaxRecordBytes = size_t(1) << 20;
inline constexpr size_t kMaxRecordFields = 1024;

// RFC 4180: fields separated by commas, records by LF or CRLF, fields in double quotes may hold commas, line
// breaks and doubled quotes. Reads one record into `fields`; false at the end of the input. A record that breaks
// the grammar (a quote inside an unquoted field, text after a closing quote, a quote never closed) or the bounds
// above sets `error` and is skipped up to the next line break, so later records still read.
bool read_csv_record(std::istream& in, std::vector<std::string>& fields, std::string& error);

// Why the clip's path or caption cannot go into the index and the latent file's metadata (both JSON, hence UTF-8
// only); empty when they can.
std::string utf8_problem(const ClipEntry& clip);

class ManifestReader {
 public:
  // Reads the header: a `path` column is required; `caption`, `start`, `end`, `fps` are optional and other
  // columns are ignored. Throws ManifestError otherwise. A row whose path or caption is not UTF-8 is a RowError.
  ManifestReader(std::istream& in, std::filesystem::path base_dir);
  // The next record, or nullopt at the end.
  std::optional<ManifestRow> next();

 private:
  std::istream& in_;
  std::filesystem::path base_;
  size_t columns_ = 0;
  int path_ = -1, caption_ = -1, start_ = -1, end_ = -1, fps_ = -1;
  uint64_t row_ = 0;
};

// Every video file directly in `dir` (by extension), sorted by name, as entries with empty captions.
std::vector<ClipEntry> folder_entries(const std::filesystem::path& dir);

}  // namespace latent::precompute

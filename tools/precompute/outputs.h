// What latent-precompute leaves in OUT_DIR besides the latent files, and how work is split: one name per clip,
// the index of finished clips (index.jsonl) and the failures (errors.jsonl), appended line by line so that a
// run killed at any moment can be resumed, and the rows each rank owns.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_set>

#include "manifest.h"

namespace latent::precompute {

// "<stem>-<16 hex digits>.safetensors": readable, and unique per (path as written, start, end, fps), so the
// same row always maps to the same file and two rows of one video with other ranges never collide.
std::string clip_file_name(const ClipEntry& clip);

// Rank `rank` of `world` takes the rows whose number modulo world is rank: every row exactly once, and each
// rank's share known without reading the others'.
bool owned_by(const ClipEntry& clip, uint64_t rank, uint64_t world);

// A JSON Lines file opened for appending. Each line goes out in one write() on an O_APPEND descriptor and is
// fsynced, so concurrent writers never interleave within a line and a crash leaves at most one torn last line.
class JsonLines {
 public:
  explicit JsonLines(const std::filesystem::path& path);
  ~JsonLines();
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  // `object` is one JSON object without line breaks (json::dump's output).
  void append(const std::string& object);

 private:
  void append_raw(const std::string& text);
  std::filesystem::path path_;
  int fd_ = -1;
};

// The `latent_file` of every complete line of an index.jsonl, streamed; a torn or unparsable line is skipped
// (its clip is simply done again). A missing file is an empty set.
std::unordered_set<std::string> finished_files(const std::filesystem::path& index);

}  // namespace latent::precompute

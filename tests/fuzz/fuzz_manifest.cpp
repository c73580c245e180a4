// libFuzzer target for latent-precompute's CSV manifest reader: no crash on any input, every record within its
// bounds, and every clip's path and caption fit for the JSON index (valid UTF-8).
#include <cstdint>
#include <sstream>
#include <string>

#include "io/json.h"
#include "manifest.h"

using namespace latent::precompute;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    std::istringstream in(text);
    std::vector<std::string> fields;
    std::string error;
    size_t records = 0;
    while (read_csv_record(in, fields, error)) {
      size_t bytes = 0;
      for (const auto& f : fields) bytes += f.size();
      if (fields.size() > kMaxRecordFields || bytes > kMaxRecordBytes) __builtin_trap();
      if (++records > size) __builtin_trap();  // every record consumes input
    }
  }
  std::istringstream in(text);
  try {
    ManifestReader reader(in, "/data");
    uint64_t expected_row = 0;
    while (auto row = reader.next()) {
      if (const auto* clip = std::get_if<ClipEntry>(&*row)) {
        if (clip->row != expected_row) __builtin_trap();
        if (latent::json::find_invalid_utf8(clip->source) != std::string::npos) __builtin_trap();
        if (latent::json::find_invalid_utf8(clip->caption) != std::string::npos) __builtin_trap();
        if (clip->start && clip->end && *clip->end <= *clip->start) __builtin_trap();
        // What the index line of this clip would be must write and read back.
        latent::json::Object entry{{"path", clip->source}, {"caption", clip->caption}};
        const std::string line = latent::json::dump(latent::json::Value(std::move(entry)));
        if (latent::json::dump(latent::json::parse(line)) != line) __builtin_trap();
      } else if (std::get<RowError>(*row).row != expected_row) {
        __builtin_trap();
      }
      ++expected_row;
    }
  } catch (const ManifestError&) {
  }
  return 0;
}

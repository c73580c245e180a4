#include "manifest.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

#include "io/json.h"

namespace latent::precompute {
namespace {

// Skips to the next record boundary after a grammar error. A quote opened in the broken record is not trusted,
// so the boundary is the next line break.
void skip_line(std::istream& in) {
  for (int c = in.get(); c != EOF && c != '\n'; c = in.get()) {
  }
}

std::string trimmed(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::optional<double> number(const std::string& text, const char* column, std::string& error) {
  const std::string t = trimmed(text);
  if (t.empty()) return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v) || v < 0) {
    error = std::string("column ") + column + ": \"" + t + "\" is not a number >= 0";
    return std::nullopt;
  }
  return v;
}

}  // namespace

bool read_csv_record(std::istream& in, std::vector<std::string>& fields, std::string& error) {
  fields.clear();
  error.clear();
  if (in.peek() == EOF) return false;
  std::string field;
  size_t bytes = 0;         // of this record, delimiters included
  bool quoted = false;      // inside a quoted field
  bool was_quoted = false;  // the current field was quoted and is closed
  // One unclosed quote would otherwise read the rest of the manifest into one field: past the bound the record is
  // an error and reading resumes at the next line break.
  auto too_long = [&](bool at_line_end) {
    if (bytes <= kMaxRecordBytes && fields.size() < kMaxRecordFields) return false;
    error = fields.size() >= kMaxRecordFields
                ? "more than " + std::to_string(kMaxRecordFields) + " fields"
                : std::string("a record longer than 1 MiB") + (quoted ? " (a quoted field that is never closed?)" : "");
    fields.clear();
    if (!at_line_end) skip_line(in);
    return true;
  };
  for (;;) {
    const int c = in.get();
    if (c != EOF && ++bytes > kMaxRecordBytes && too_long(c == '\n' && !quoted)) return true;
    if (quoted) {
      if (c == EOF) {
        error = "a quoted field is never closed";
        return true;
      }
      if (c == '"') {
        if (in.peek() == '"') {
          in.get();
          ++bytes;
          field += '"';
        } else {
          quoted = false;
          was_quoted = true;
        }
      } else {
        field += char(c);
      }
      continue;
    }
    if (c == EOF || c == '\n' || c == ',') {
      if (c == '\n' && !field.empty() && field.back() == '\r' && !was_quoted) field.pop_back();
      fields.push_back(std::move(field));
      field.clear();
      was_quoted = false;
      if (c != ',') return true;
      if (too_long(false)) return true;
      continue;
    }
    if (c == '\r' && was_quoted && in.peek() == '\n') continue;
    if (was_quoted) {
      error = "text after a closing quote";
      skip_line(in);
      return true;
    }
    if (c == '"') {
      if (!field.empty()) {
        error = "a quote inside an unquoted field";
        skip_line(in);
        return true;
      }
      quoted = true;
      continue;
    }
    field += char(c);
  }
}

std::string utf8_problem(const ClipEntry& clip) {
  auto check = [](const char* what, const std::string& text) -> std::string {
    const size_t at = json::find_invalid_utf8(text);
    if (at == std::string::npos) return "";
    char detail[64];
    std::snprintf(detail, sizeof detail, " (byte 0x%02X at offset %zu)", static_cast<unsigned char>(text[at]), at);
    return std::string(what) + " is not valid UTF-8" + detail +
           ": the index and the latent files are JSON, which holds UTF-8 text only";
  };
  std::string problem = check("the path", clip.source);
  return problem.empty() ? check("the caption", clip.caption) : problem;
}

ManifestReader::ManifestReader(std::istream& in, std::filesystem::path base_dir) : in_(in), base_(std::move(base_dir)) {
  std::vector<std::string> header;
  std::string error;
  if (!read_csv_record(in_, header, error)) throw ManifestError("the manifest is empty: expected a header row");
  if (!error.empty()) throw ManifestError("the manifest's header row is malformed: " + error);
  if (!header.empty() && header[0].rfind("\xEF\xBB\xBF", 0) == 0) header[0].erase(0, 3);  // a UTF-8 BOM
  std::set<std::string> seen;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string name = trimmed(header[i]);
    if (!seen.insert(name).second && !name.empty())
      throw ManifestError("the manifest's header names column \"" + name + "\" twice");
    int* slot = name == "path"      ? &path_
                : name == "caption" ? &caption_
                : name == "start"   ? &start_
                : name == "end"     ? &end_
                : name == "fps"     ? &fps_
                                    : nullptr;
    if (slot) *slot = int(i);
  }
  if (path_ < 0)
    throw ManifestError("the manifest's header has no \"path\" column (expected path,caption[,start,end,fps])");
  columns_ = header.size();
}

std::optional<ManifestRow> ManifestReader::next() {
  std::vector<std::string> f;
  std::string error;
  for (;;) {
    if (!read_csv_record(in_, f, error)) return std::nullopt;
    // Blank lines between records carry nothing; they are not rows.
    if (error.empty() && f.size() == 1 && trimmed(f[0]).empty()) continue;
    break;
  }
  const uint64_t row = row_++;
  if (!error.empty()) return RowError{row, error};
  if (f.size() != columns_)
    return RowError{row, std::to_string(f.size()) + " fields, the header has " + std::to_string(columns_)};
  ClipEntry e;
  e.row = row;
  e.source = f[size_t(path_)];
  if (trimmed(e.source).empty()) return RowError{row, "empty path"};
  const std::filesystem::path p(e.source);
  e.path = p.is_absolute() ? p : base_ / p;
  if (caption_ >= 0) e.caption = f[size_t(caption_)];
  if (start_ >= 0) e.start = number(f[size_t(start_)], "start", error);
  if (error.empty() && end_ >= 0) e.end = number(f[size_t(end_)], "end", error);
  if (error.empty() && fps_ >= 0) e.fps = number(f[size_t(fps_)], "fps", error);
  if (!error.empty()) return RowError{row, error};
  if (e.fps && *e.fps == 0) return RowError{row, "column fps: 0 is not a frame rate"};
  if (e.start && e.end && *e.end <= *e.start) return RowError{row, "end is not after start"};
  // Refused now, before the clip is decoded and encoded, rather than when its metadata is written.
  if (std::string problem = utf8_problem(e); !problem.empty()) return RowError{row, problem};
  return e;
}

std::vector<ClipEntry> folder_entries(const std::filesystem::path& dir) {
  static const std::set<std::string> kVideo = {".mp4", ".mkv",  ".webm", ".mov", ".avi", ".m4v",
                                               ".mpg", ".mpeg", ".ts",   ".ogv", ".flv", ".wmv"};
  std::vector<std::filesystem::path> files;
  for (const auto& d : std::filesystem::directory_iterator(dir)) {
    std::string ext = d.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (d.is_regular_file() && kVideo.count(ext)) files.push_back(d.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<ClipEntry> out;
  for (size_t i = 0; i < files.size(); ++i) {
    ClipEntry e;
    e.row = i;
    e.path = files[i];
    e.source = files[i].filename().string();
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace latent::precompute

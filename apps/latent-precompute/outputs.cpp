#include "outputs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "io/json.h"
#include "io/numbers.h"

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
  std::string key =
      clip.source + '\n' + optional_text(clip.start) + '\n' + optional_text(clip.end) + '\n' + optional_text(clip.fps);
  // Only a caption joins the key, so rows without one keep the names earlier versions gave them (and resume).
  if (!clip.caption.empty()) key += '\n' + clip.caption;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  return safe_stem(clip.source) + "-" + hex + ".safetensors";
}

bool owned_by(const ClipEntry& clip, uint64_t rank, uint64_t world) { return world <= 1 || clip.row % world == rank; }

namespace {

// A set variable's value as an integer in [0, 2^32]; nullopt when unset.
std::optional<uint64_t> env_count(const std::function<const char*(const char*)>& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  if (auto n = latent::bounded_integer(v, 0, int64_t(1) << 32)) return uint64_t(*n);
  throw std::invalid_argument(std::string("$") + name + "=\"" + v + "\" is not a non-negative integer");
}

std::string assignment(const char* name, uint64_t v) { return std::string("$") + name + "=" + std::to_string(v); }

// A rank and its world size, both or neither; the world size from a launcher is never 0. `lone_zero` takes a
// rank 0 without a world size as a single process (Slurm sets SLURM_PROCID=0 in a batch script run without -n).
void rank_pair(const std::function<const char*(const char*)>& env, const char* rank_name, const char* world_name,
               LaunchRank& out, bool lone_zero = false) {
  const std::optional<uint64_t> rank = env_count(env, rank_name);
  std::optional<uint64_t> world = env_count(env, world_name);
  if (lone_zero && rank == uint64_t(0) && !world) world = 1;
  if (rank && !world) throw std::invalid_argument(assignment(rank_name, *rank) + " is set without $" + world_name);
  if (world && !rank) throw std::invalid_argument(assignment(world_name, *world) + " is set without $" + rank_name);
  if (*world == 0) throw std::invalid_argument(assignment(world_name, 0) + ": a world size is at least 1");
  if (*rank >= *world)
    throw std::invalid_argument(assignment(rank_name, *rank) + " is not below " + assignment(world_name, *world));
  out.rank = *rank;
  out.world = *world;
}

// A job array's task as (index, count), or nullopt outside an array. Ids run MIN, MIN+STEP, ..., MAX; a list
// with gaps (--array=1,4,9) has no index that leaves no row out, so it is refused.
std::optional<std::pair<uint64_t, uint64_t>> array_task(const std::function<const char*(const char*)>& env) {
  const auto id = env_count(env, "SLURM_ARRAY_TASK_ID");
  if (!id) return std::nullopt;
  const auto lo = env_count(env, "SLURM_ARRAY_TASK_MIN"), hi = env_count(env, "SLURM_ARRAY_TASK_MAX"),
             count = env_count(env, "SLURM_ARRAY_TASK_COUNT");
  const uint64_t step = env_count(env, "SLURM_ARRAY_TASK_STEP").value_or(1);
  if (!lo || !hi || !count)
    throw std::invalid_argument(assignment("SLURM_ARRAY_TASK_ID", *id) +
                                " is set without $SLURM_ARRAY_TASK_MIN, _MAX and _COUNT");
  if (step == 0 || *hi < *lo || *id < *lo || *id > *hi || (*id - *lo) % step || (*hi - *lo) / step + 1 != *count ||
      (*hi - *lo) % step)
    throw std::invalid_argument(
        "the job array's ids " + assignment("SLURM_ARRAY_TASK_ID", *id) + " " +
        assignment("SLURM_ARRAY_TASK_MIN", *lo) + " " + assignment("SLURM_ARRAY_TASK_MAX", *hi) + " " +
        assignment("SLURM_ARRAY_TASK_STEP", step) + " " + assignment("SLURM_ARRAY_TASK_COUNT", *count) +
        " are not one evenly spaced range: give --rank and --world-size instead");
  return std::pair{(*id - *lo) / step, *count};
}

}  // namespace

LaunchRank launch_rank(const std::function<const char*(const char*)>& env) {
  LaunchRank out;
  auto set = [&](const char* name) { return env_count(env, name).has_value(); };
  if (set("RANK") || set("WORLD_SIZE")) {
    rank_pair(env, "RANK", "WORLD_SIZE", out);
    out.local_rank = env_count(env, "LOCAL_RANK");
    out.source = "$RANK/$WORLD_SIZE";
    return out;
  }
  const auto array = array_task(env);
  // A task of srun has SLURM_PROCID; a shell of salloc has SLURM_NTASKS alone, for the allocation, not for it.
  if (set("SLURM_PROCID")) {
    rank_pair(env, "SLURM_PROCID", "SLURM_NTASKS", out, true);
    out.local_rank = env_count(env, "SLURM_LOCALID");
    out.source = "$SLURM_PROCID/$SLURM_NTASKS";
  }
  if (array) {
    if (out.world > (uint64_t(1) << 32) / array->second)
      throw std::invalid_argument("a job array of " + std::to_string(array->second) + " jobs of " +
                                  std::to_string(out.world) + " tasks is more than 2^32 ranks");
    out.rank += array->first * out.world;
    out.world *= array->second;
    out.source += out.source.empty() ? "$SLURM_ARRAY_TASK_ID" : " and $SLURM_ARRAY_TASK_ID";
  }
  return out;
}

int local_gpu(uint64_t local_rank, int gpus) {
  if (gpus > 0 && local_rank < uint64_t(gpus)) return int(local_rank);
  if (gpus == 1) return 0;
  throw std::invalid_argument("local rank " + std::to_string(local_rank) +
                              " has no GPU of its own: this process sees " + std::to_string(gpus) +
                              " GPUs; give --device");
}

std::filesystem::path rank_index(const std::filesystem::path& out_dir, uint64_t rank) {
  return out_dir / ("index-rank" + std::to_string(rank) + ".jsonl");
}

std::filesystem::path rank_errors(const std::filesystem::path& out_dir, uint64_t rank) {
  return out_dir / ("errors-rank" + std::to_string(rank) + ".jsonl");
}

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
  // Only a file can be an index: a device or a pipe in its place would be read without end.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(index, ec)) return out;
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

namespace latent::precompute {

std::unordered_set<std::string> finished_in(const std::filesystem::path& out_dir) {
  std::unordered_set<std::string> out = finished_files(out_dir / "index.jsonl");
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string f = d.path().filename().string();
    if (f.rfind("index-rank", 0) == 0 && d.path().extension() == ".jsonl") out.merge(finished_files(d.path()));
  }
  return out;
}

RankLock::RankLock(const std::filesystem::path& out_dir, uint64_t rank) {
  const std::filesystem::path path = out_dir / (".lock-rank" + std::to_string(rank));
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw OutputError(path.string() + ": cannot create the lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw OutputError("another latent-precompute of rank " + std::to_string(rank) + " is writing to " +
                        out_dir.string() + " (it holds " + path.filename().string() +
                        "); one process per rank and folder, or give this one another --rank");
    throw OutputError(path.string() + ": cannot lock: " + std::strerror(err));
  }
}

RankLock::~RankLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, an empty marker
}

namespace {

std::string settings_text(const DatasetSettings& s) {
  json::Object o;
  for (const auto& [k, v] : s) o.emplace_back(k, v);
  return json::dump(json::Value(std::move(o))) + "\n";
}

// Creates `path` holding `text` only if it does not exist yet, whole or not at all: written beside it, then
// link()ed into place, which fails when another process won the race.
bool create_exclusively(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw OutputError(tmp.string() + ": cannot create: " + std::strerror(errno));
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int write_err = errno;
  const bool synced = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int sync_err = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    throw OutputError(path.string() + ": cannot write: " +
                      (n < 0                       ? std::strerror(write_err)
                       : n != ssize_t(text.size()) ? "short write"
                                                   : std::strerror(sync_err)));
  }
  const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
  const int link_err = errno;
  ::unlink(tmp.c_str());
  if (!linked && link_err != EEXIST) throw OutputError(path.string() + ": cannot create: " + std::strerror(link_err));
  return linked;
}

}  // namespace

void check_settings(const std::filesystem::path& out_dir, const DatasetSettings& wanted) {
  const std::filesystem::path path = out_dir / "settings.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && create_exclusively(path, settings_text(wanted))) return;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::map<std::string, std::string> recorded;
  try {
    const json::Value doc = json::parse(text.str());
    for (const auto& [k, v] : doc.as_object()) recorded[k] = v.as_string();
  } catch (const json::Error& e) {
    throw OutputError(path.string() + " is not a settings file latent-precompute wrote (" + e.what() +
                      "); remove it only if the folder holds no latents of other settings");
  }
  for (const auto& [k, v] : wanted) {
    auto it = recorded.find(k);
    const std::string was = it == recorded.end() ? "(not recorded)" : it->second;
    if (was != v)
      throw OutputError(out_dir.string() + " holds latents encoded with " + k + " " + was + "; this run asks for " + k +
                        " " + v + ". Rerun with the settings of " + path.filename().string() +
                        " to resume, or write to another folder");
  }
}

}  // namespace latent::precompute

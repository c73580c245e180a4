// What latent-precompute leaves in OUT_DIR besides the latent files, and how work is split: one name per row,
// each rank's index of finished clips (index-rankR.jsonl) and failures (errors-rankR.jsonl), appended line by
// line so that a run killed at any moment can be resumed, the rows each rank owns, the lock that keeps one
// process per rank, and the encode settings the folder was made with.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "manifest.h"

namespace latent::precompute {

// OUT_DIR cannot be used: locked by another process of the same rank, made with other settings, unwritable.
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "<stem>-<16 hex digits>.safetensors": readable, and unique per (path as written, start, end, fps, caption), so
// the same row always maps to the same file, and two rows of one video with other ranges or other captions (a
// caption dataset often describes one clip several times) never collide. Rows equal in all five are one sample.
std::string clip_file_name(const ClipEntry& clip);

// Rank `rank` of `world` takes the rows whose number modulo world is rank: every row exactly once, and each
// rank's share known without reading the others'.
bool owned_by(const ClipEntry& clip, uint64_t rank, uint64_t world);

// Where this process stands among the processes of a run, read from the launcher's environment: torchrun's
// RANK, WORLD_SIZE, LOCAL_RANK; else Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (the tasks of one srun;
// without SLURM_PROCID, as in an salloc shell, SLURM_NTASKS counts the allocation's tasks and is not read),
// times the tasks of a job array (SLURM_ARRAY_TASK_ID over SLURM_ARRAY_TASK_MIN..MAX by SLURM_ARRAY_TASK_STEP,
// SLURM_ARRAY_TASK_COUNT of them), so an array of N jobs of M tasks is N*M ranks. torchrun's win when both are
// set: a torchrun inside a Slurm job sets its own ranks, and Slurm's describe the job, not the process. Nothing
// set: rank 0 of 1. The split is static (owned_by), so no process group forms and MASTER_ADDR/PORT are not read.
struct LaunchRank {
  uint64_t rank = 0, world = 1;
  std::optional<uint64_t> local_rank;  // the process's index on its machine, when the launcher says
  std::string source;                  // the variables it came from, for messages; empty: none were set
};

// `env` looks a variable up: nullptr (or "") when it is unset. Throws std::invalid_argument naming the variable
// and its value when one is not a non-negative integer, when a rank comes without its world size (or a world
// size of 0), when a rank is not below its world size, or when a job array's ids are not one evenly spaced range.
LaunchRank launch_rank(const std::function<const char*(const char*)>& env);

// The GPU a process of local rank `local_rank` takes when the device is left to the tool and `gpus` are visible:
// its own under torchrun (all of a machine's GPUs visible, one process per GPU), the only one when the launcher
// gave each process one GPU (Slurm's --gpus-per-task=1 hides the others). Throws std::invalid_argument when the
// local rank has no GPU of its own.
int local_gpu(uint64_t local_rank, int gpus);

// Each rank appends to files of its own: appends from several machines to one file of a shared filesystem (NFS)
// are not atomic, one writer per file is.
std::filesystem::path rank_index(const std::filesystem::path& out_dir, uint64_t rank);   // index-rankR.jsonl
std::filesystem::path rank_errors(const std::filesystem::path& out_dir, uint64_t rank);  // errors-rankR.jsonl

// A JSON Lines file opened for appending. Each line goes out in one write() on an O_APPEND descriptor and is
// fsynced, so a crash leaves at most one torn last line. Throws std::runtime_error (with the path and the
// system's reason) when the file cannot be opened or a line cannot be written whole (a full disk, EFBIG).
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
// (its clip is simply done again). A missing file, or anything but a regular file, is an empty set.
std::unordered_set<std::string> finished_files(const std::filesystem::path& index);

// What every index of OUT_DIR lists: index-rank*.jsonl, and index.jsonl of folders written before the indexes
// were per rank. All ranks' are read, so a rerun with another world size skips what any rank finished.
std::unordered_set<std::string> finished_in(const std::filesystem::path& out_dir);

// An exclusive flock() on OUT_DIR/.lock-rankR, held while the object lives: a second process of the same rank on
// the same folder would encode the same rows and append to the same index. Throws OutputError naming the rank
// when another process holds it.
class RankLock {
 public:
  RankLock(const std::filesystem::path& out_dir, uint64_t rank);
  ~RankLock();
  RankLock(const RankLock&) = delete;
  RankLock& operator=(const RankLock&) = delete;

 private:
  int fd_ = -1;
};

// The settings that change what a latent file holds (model, dtype, size, fps, max-frames), as name -> text.
using DatasetSettings = std::vector<std::pair<std::string, std::string>>;

// OUT_DIR/settings.json records the settings of the first run (created atomically, so concurrent ranks agree on
// one); a later run with other settings would mix two datasets in one folder, so it is refused with an
// OutputError naming the first setting that differs.
void check_settings(const std::filesystem::path& out_dir, const DatasetSettings& wanted);

}  // namespace latent::precompute

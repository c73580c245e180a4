// latent-precompute: encodes a dataset of videos to latent files for training, from a CSV manifest or a folder,
// one GStreamer pipeline per clip, resumable, in memory bounded by the clips in flight. docs/precompute.md.
#include <gst/gst.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clip_pipeline.h"
#include "io/json.h"
#include "io/numbers.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/default_model.h"
#include "latent/runtime/devices.h"
#include "latent/runtime/shared_models.h"
#include "manifest.h"
#include "outputs.h"

namespace fs = std::filesystem;
using namespace latent::precompute;
using latent::json::Value;

namespace {

constexpr int kExitFailedClips = 1;  // some clips failed (the others are done)
constexpr int kExitUsage = 2;
// nothing could run (unreadable manifest, output folder or model), or the run had to stop (a full disk)
constexpr int kExitFatal = 3;

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: latent-precompute [options] MANIFEST.csv|VIDEO_DIR OUT_DIR\n"
               "Encodes every clip of the manifest (CSV: path,caption[,start,end,fps]; paths relative to it) or\n"
               "every video of the folder to OUT_DIR/<name>.safetensors, listed in OUT_DIR/index-rankR.jsonl;\n"
               "failures go to OUT_DIR/errors-rankR.jsonl. A rerun skips the clips already in an index.\n"
               "  --model PATH        the VAE (default: the built-in default model)\n"
               "  --device D          auto, cpu, cuda, cuda:N (default: auto, the first GPU if any)\n"
               "  --devices D1,D2     one stream per device, in threads of this process\n"
               "  --dtype T           auto, float32, float16, bfloat16 (default: auto)\n"
               "  --width W --height H  resize and centre-crop every clip to WxH (multiples of the model's\n"
               "                      spatial factor: 8, or 16 for wan2.2)\n"
               "  --fps F             resample to F frames/s (a row's fps column wins)\n"
               "  --max-frames N      encode at most N frames of each clip\n"
               "  --rank R --world-size N  take every N-th row from row R (default: $RANK, $WORLD_SIZE as\n"
               "                      torchrun sets them, else Slurm's $SLURM_PROCID, $SLURM_NTASKS and job array)\n"
               "  --timeout S         give a clip up after S seconds (default 3600)\n"
               "  --no-seek           decode every clip from the start of its video, for a source whose seeks\n"
               "                      are not exact (the default seeks near a clip's start when it can)\n"
               "  --verbose, -v       a line per clip: where it seeked, frames decoded before its start\n"
               "exit status: 0 all clips done, 1 some clips failed (see errors-rankR.jsonl), 2 bad usage, 3 nothing\n"
               "could run or the run had to stop (manifest, output folder or model unusable, OUT_DIR in use by\n"
               "another process of this rank or made with other settings, the disk full)\n");
  std::exit(code);
}

struct Options {
  fs::path manifest, out;
  EncodeSettings encode;
  std::vector<std::string> devices{"auto"};
  bool verbose = false;
  bool device_named = false;  // --device or --devices: the launcher's local rank does not pick one
  LaunchRank launch;
  uint64_t rank = 0, world = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  try {
    o.launch = launch_rank([](const char* name) { return std::getenv(name); });
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "latent-precompute: %s\n", e.what());
    std::exit(kExitUsage);
  }
  o.rank = o.launch.rank;
  o.world = o.launch.world;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "latent-precompute: %s needs a value\n", k.c_str());
        usage(kExitUsage);
      }
      return argv[++i];
    };
    auto integer = [&](int64_t lo, int64_t hi) {
      const std::string v = value();
      if (auto n = latent::bounded_integer(v, lo, hi)) return *n;
      std::fprintf(stderr, "latent-precompute: %s wants an integer in [%lld, %lld], got '%s'\n", k.c_str(),
                   (long long)lo, (long long)hi, v.c_str());
      usage(kExitUsage);
    };
    auto number = [&](double lo, double hi) {
      const std::string v = value();
      if (auto n = latent::bounded_number(v, lo, hi)) return *n;
      std::fprintf(stderr, "latent-precompute: %s wants a number in [%g, %g], got '%s'\n", k.c_str(), lo, hi,
                   v.c_str());
      usage(kExitUsage);
    };
    if (k == "--help" || k == "-h")
      usage(0);
    else if (k == "--model")
      o.encode.model = value();
    else if (k == "--device") {
      o.devices = {value()};
      o.device_named = true;
    } else if (k == "--devices") {
      o.device_named = true;
      o.devices.clear();
      std::stringstream list(value());
      for (std::string d; std::getline(list, d, ',');)
        if (!d.empty()) o.devices.push_back(d);
      if (o.devices.empty()) usage(kExitUsage);
    } else if (k == "--dtype")
      o.encode.dtype = value();
    else if (k == "--width")
      o.encode.width = int(integer(8, 16384));
    else if (k == "--height")
      o.encode.height = int(integer(8, 16384));
    else if (k == "--fps")
      o.encode.fps = number(1e-3, 1000);
    else if (k == "--max-frames")
      o.encode.max_frames = uint64_t(integer(1, int64_t(1) << 40));
    else if (k == "--rank") {
      o.rank = uint64_t(integer(0, int64_t(1) << 32));
      o.launch.source = "--rank, --world-size";
    } else if (k == "--world-size") {
      o.world = uint64_t(integer(1, int64_t(1) << 32));
      o.launch.source = "--rank, --world-size";
    } else if (k == "--timeout")
      o.encode.timeout_seconds = number(1, 1e7);
    else if (k == "--no-seek")
      o.encode.seek = false;
    else if (k == "--verbose" || k == "-v")
      o.verbose = true;
    else if (k.rfind("--", 0) == 0) {
      std::fprintf(stderr, "latent-precompute: unknown option %s\n", k.c_str());
      usage(kExitUsage);
    } else
      positional.push_back(k);
  }
  if (positional.size() != 2) usage(kExitUsage);
  if ((o.encode.width > 0) != (o.encode.height > 0) || o.encode.width % 8 || o.encode.height % 8) {
    std::fprintf(stderr, "latent-precompute: give --width and --height together, as multiples of 8\n");
    std::exit(kExitUsage);
  }
  if (o.world == 0 || o.rank >= o.world) {
    std::fprintf(stderr, "latent-precompute: rank %llu is not below world size %llu\n", (unsigned long long)o.rank,
                 (unsigned long long)o.world);
    std::exit(kExitUsage);
  }
  o.manifest = positional[0];
  o.out = positional[1];
  return o;
}

// Rows come from the manifest one at a time; only the clips in the queue and in the workers' hands are in memory.
class Feed {
 public:
  Feed(const Options& o) : o_(o) {
    if (fs::is_directory(o.manifest)) {
      folder_ = folder_entries(o.manifest);
      return;
    }
    file_.open(o.manifest);
    if (!file_) throw ManifestError(o.manifest.string() + ": cannot open the manifest");
    // A pipe (`<(cat m.csv)`) can be read only once and has no folder of its own: relative paths are taken from
    // the current directory.
    regular_ = fs::is_regular_file(o.manifest);
    reader_.emplace(file_, regular_ ? o.manifest.parent_path() : fs::current_path());
  }
  // Rows this rank will see, for the progress line's total and ETA: from a first streamed pass over a regular
  // file (read twice, never held); unknown for a pipe, which cannot be read twice.
  std::optional<uint64_t> count() const {
    if (!reader_) return owned(folder_.size());
    if (!regular_) return std::nullopt;
    std::ifstream again(o_.manifest);
    ManifestReader r(again, o_.manifest.parent_path());
    uint64_t rows = 0;
    while (r.next()) ++rows;
    return owned(rows);
  }

  std::optional<ManifestRow> next() {
    std::lock_guard<std::mutex> lock(mu_);
    for (;;) {
      std::optional<ManifestRow> row;
      if (reader_) {
        row = reader_->next();
      } else if (next_folder_ < folder_.size()) {
        const ClipEntry& e = folder_[next_folder_++];
        if (std::string problem = utf8_problem(e); !problem.empty())
          row = RowError{e.row, problem};
        else
          row = e;
      }
      if (!row) return std::nullopt;
      const uint64_t n = std::visit([](const auto& r) { return r.row; }, *row);
      if (o_.world <= 1 || n % o_.world == o_.rank) return row;
    }
  }

 private:
  uint64_t owned(uint64_t rows) const {
    return o_.world <= 1 ? rows : rows / o_.world + (o_.rank < rows % o_.world ? 1 : 0);
  }
  const Options& o_;
  std::mutex mu_;
  std::ifstream file_;
  bool regular_ = true;
  std::optional<ManifestReader> reader_;
  std::vector<ClipEntry> folder_;
  size_t next_folder_ = 0;
};

struct Totals {
  std::atomic<uint64_t> done{0}, failed{0}, skipped{0}, frames{0}, latents{0};
};

class Progress {
 public:
  Progress(const Totals& t, std::optional<uint64_t> total)
      : t_(t), total_(total), tty_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}
  void update(bool force = false) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    const double every = tty_ ? 0.2 : 10.0;
    if (!force && std::chrono::duration<double>(now - last_).count() < every) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const uint64_t seen = t_.done + t_.failed + t_.skipped, worked = t_.done + t_.failed;
    // Skipped clips cost nothing, so the ETA is paced by the clips actually encoded (or attempted).
    char eta[48] = "", of[32] = "";
    if (total_) std::snprintf(of, sizeof of, "/%llu", (unsigned long long)*total_);
    if (total_ && worked > 0 && *total_ > seen)
      std::snprintf(eta, sizeof eta, ", ETA %.0f s", s / double(worked) * double(*total_ - seen));
    std::fprintf(stderr, "%s%llu%s clips: %llu done, %llu failed, %llu skipped; %llu frames, %.1f frames/s, %.0f s%s%s",
                 tty_ ? "\r\033[K" : "", (unsigned long long)seen, of, (unsigned long long)t_.done.load(),
                 (unsigned long long)t_.failed.load(), (unsigned long long)t_.skipped.load(),
                 (unsigned long long)t_.frames.load(), s > 0 ? double(t_.frames.load()) / s : 0.0, s, eta,
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  const Totals& t_;
  std::optional<uint64_t> total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_{};
  std::mutex mu_;
};

std::string shape_text(const fs::path& file, Value& shape) {
  latent::SafetensorsFile f = latent::SafetensorsFile::open(file);
  latent::json::Array dims;
  for (int64_t d : f.entry("latents").shape) dims.push_back(Value::integer(d));
  shape = Value(std::move(dims));
  return f.metadata().count("latent.model") ? f.metadata().at("latent.model") : "";
}

const char* dtype_text(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: return "other";
  }
}

// What a latent file depends on besides its row; a folder holds latents of one set of these.
DatasetSettings dataset_settings(const EncodeSettings& e, const latent::Vae& vae, torch::ScalarType dtype) {
  std::error_code ec;
  const fs::path model = fs::weakly_canonical(e.model, ec);
  char fps[32] = "source";
  if (e.fps > 0) std::snprintf(fps, sizeof fps, "%.17g", e.fps);
  return {{"model", ec ? e.model : model.string()},
          {"model_id", vae.spec().model_id},
          {"dtype", dtype_text(dtype)},
          {"size", e.width > 0 ? std::to_string(e.width) + "x" + std::to_string(e.height) : "source"},
          {"fps", fps},
          {"max_frames", e.max_frames ? std::to_string(e.max_frames) : "all"}};
}

// Names this process has finished or is encoding: a row repeated in the manifest (the same path, range, fps and
// caption) is the same sample, encoded once.
class Claims {
 public:
  explicit Claims(std::unordered_set<std::string> finished) : finished_(std::move(finished)) {}
  bool claim(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return !finished_.count(name) && busy_.insert(name).second;
  }
  void release(const std::string& name, bool done) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_.erase(name);
    if (done) finished_.insert(name);
  }

 private:
  std::mutex mu_;
  std::unordered_set<std::string> finished_, busy_;
};

// The first error that stops the run (an index or error line that cannot be written: the disk is full); the
// workers finish the clip in hand and take no more.
class Stop {
 public:
  void raise(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.empty()) why_ = why;
    stopped_ = true;
  }
  bool stopped() const { return stopped_; }
  std::string why() {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }

 private:
  std::mutex mu_;
  std::string why_;
  std::atomic<bool> stopped_{false};
};

}  // namespace

int main(int argc, char** argv) {
  gst_init(&argc, &argv);
  // A file over RLIMIT_FSIZE then fails its write() with EFBIG, which is reported, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  Options o = parse(argc, argv);
  if (o.world > 1)
    std::fprintf(stderr, "latent-precompute: rank %llu of %llu (%s)\n", (unsigned long long)o.rank,
                 (unsigned long long)o.world, o.launch.source.c_str());
  {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    if (!fs::is_directory(o.out)) {
      std::fprintf(stderr, "latent-precompute: cannot create %s: %s\n", o.out.c_str(),
                   ec ? ec.message().c_str() : "a file of that name is in the way");
      return kExitFatal;
    }
  }
  for (const char* element : {"vaeencode", "latentfilesink"}) {
    if (GstElementFactory* f = gst_element_factory_find(element)) {
      gst_object_unref(f);
      continue;
    }
    std::fprintf(stderr,
                 "latent-precompute: GStreamer has no element %s: the gst-latent plugin is not installed "
                 "where GStreamer looks (see GST_PLUGIN_PATH)\n",
                 element);
    return kExitFatal;
  }
  // Taken before anything slow, so a second process of this rank is turned away at once.
  std::optional<RankLock> rank_lock;
  try {
    rank_lock.emplace(o.out, o.rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-precompute: %s\n", e.what());
    return kExitFatal;
  }
  // One loaded copy of the model per device for the whole run: every clip's vaeencode asks for the same
  // (path, device, dtype) and shares it instead of loading it again.
  // A launcher that starts one process per GPU (torchrun, srun) gives each its local rank: with the device left
  // to the tool, each process takes its own GPU instead of all of them sharing the first.
  if (!o.device_named && o.launch.local_rank && torch::cuda::is_available()) {
    try {
      o.devices = {"cuda:" + std::to_string(local_gpu(*o.launch.local_rank, int(torch::cuda::device_count())))};
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "latent-precompute: %s (%s)\n", e.what(), o.launch.source.c_str());
      return kExitUsage;
    }
  }
  std::vector<std::shared_ptr<const latent::Vae>> keep;
  std::vector<std::string> devices;  // resolved: "auto" becomes the device it chose
  torch::ScalarType dtype = torch::kFloat;
  try {
    if (o.encode.model.empty()) o.encode.model = latent::find_default_model().string();
    for (const std::string& d : o.devices) {
      const torch::Device device = latent::resolve_device(d);
      const torch::ScalarType t = latent::resolve_dtype(o.encode.dtype, device);
      if (!keep.empty() && t != dtype) {
        std::fprintf(stderr,
                     "latent-precompute: the devices would write latents of two dtypes (%s on %s, %s on %s); give "
                     "--dtype\n",
                     dtype_text(dtype), devices[0].c_str(), dtype_text(t), device.str().c_str());
        return kExitUsage;
      }
      dtype = t;
      devices.push_back(device.str());
      keep.push_back(latent::shared_vae(o.encode.model, {device, t}));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-precompute: cannot load the model: %s\n", e.what());
    return kExitFatal;
  }
  // Said once up front rather than as a failure of every clip: the model decides the size rule (16 for wan2.2).
  if (o.encode.width > 0) {
    try {
      keep[0]->check_frame_size(o.encode.width, o.encode.height);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "latent-precompute: --width/--height: %s\n", e.what());
      return kExitUsage;
    }
  }
  std::unique_ptr<Feed> feed;
  std::unique_ptr<JsonLines> index, errors;
  try {
    check_settings(o.out, dataset_settings(o.encode, *keep[0], dtype));
    index = std::make_unique<JsonLines>(rank_index(o.out, o.rank));
    errors = std::make_unique<JsonLines>(rank_errors(o.out, o.rank));
    feed = std::make_unique<Feed>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-precompute: %s\n", e.what());
    return kExitFatal;
  }
  // Temporary twins of clip files a killed run was writing (".<name>.tmp-XXXX"); each is removed when its clip
  // comes up in this run, so another rank's file in progress is never touched.
  std::unordered_map<std::string, std::vector<fs::path>> stale;
  {
    std::error_code ec;
    for (const auto& d : fs::directory_iterator(o.out, ec)) {
      const std::string f = d.path().filename().string();
      const size_t tmp = f.rfind(".tmp-");
      if (f.size() > 1 && f[0] == '.' && tmp != std::string::npos) stale[f.substr(1, tmp - 1)].push_back(d.path());
    }
  }
  std::mutex stale_mu;
  auto drop_stale = [&](const std::string& name) {
    std::lock_guard<std::mutex> lock(stale_mu);
    auto it = stale.find(name);
    if (it == stale.end()) return;
    std::error_code ec;
    for (const fs::path& p : it->second) fs::remove(p, ec);
    stale.erase(it);
  };
  Claims claims(finished_in(o.out));
  std::mutex log_mu;
  Totals totals;
  Progress progress(totals, feed->count());
  Stop stop;

  auto record_error = [&](uint64_t row, const std::string& source, const std::string& reason) {
    latent::json::Object e{{"row", Value::unsigned_integer(row)}, {"path", source}, {"reason", reason}};
    std::lock_guard<std::mutex> lock(log_mu);
    errors->append(latent::json::dump(Value(std::move(e))));
  };
  auto encode_row = [&](const ClipEntry& clip, const EncodeSettings& s) {
    const std::string name = clip_file_name(clip);
    drop_stale(name);
    if (!claims.claim(name)) {
      totals.skipped++;
      return;
    }
    ClipResult r;
    try {
      r = encode_clip(clip, s, o.out / name);
    } catch (const std::exception& e) {
      r.reason = std::string("the pipeline failed: ") + e.what();
    }
    if (o.verbose) {
      std::lock_guard<std::mutex> lock(log_mu);
      std::fprintf(stderr, "%slatent-precompute: row %llu (%s): %s%s%llu frames decoded before the clip's start\n",
                   isatty(STDERR_FILENO) ? "\r\033[K" : "", (unsigned long long)clip.row, clip.source.c_str(),
                   r.seek.c_str(), r.seek.empty() ? "" : "; ", (unsigned long long)r.frames_before);
    }
    if (!r.ok) {
      claims.release(name, false);
      totals.failed++;
      record_error(clip.row, clip.source, r.reason);
      return;
    }
    Value shape;
    std::string model;
    try {
      model = shape_text(o.out / name, shape);
    } catch (const std::exception& e) {
      // Left in place: the name may hold another process's good copy of the same row, and a file no index lists
      // is encoded again by the next run.
      claims.release(name, false);
      totals.failed++;
      record_error(clip.row, clip.source, std::string("the written file does not read back: ") + e.what());
      return;
    }
    latent::json::Object entry{{"path", clip.source},
                               {"caption", clip.caption},
                               {"latent_file", name},
                               {"frames", Value::unsigned_integer(r.frames)},
                               {"latents", Value::unsigned_integer(r.latents)},
                               {"shape", shape},
                               {"model", model}};
    if (clip.start) entry.emplace_back("start", Value::real(*clip.start));
    if (clip.end) entry.emplace_back("end", Value::real(*clip.end));
    {
      std::lock_guard<std::mutex> lock(log_mu);
      index->append(latent::json::dump(Value(std::move(entry))));
    }
    claims.release(name, true);
    totals.done++;
    totals.frames += r.frames;
    totals.latents += r.latents;
  };
  auto worker = [&](const std::string& device) {
    EncodeSettings s = o.encode;
    s.device = device;
    // What escapes here cannot be recorded (the index or the error log cannot be written): it stops the run,
    // reported by main, rather than ending it in std::terminate.
    try {
      while (!stop.stopped()) {
        auto row = feed->next();
        if (!row) break;
        if (const auto* bad = std::get_if<RowError>(&*row)) {
          totals.failed++;
          record_error(bad->row, "", "manifest: " + bad->reason);
        } else {
          encode_row(std::get<ClipEntry>(*row), s);
        }
        progress.update();
      }
    } catch (const std::exception& e) {
      stop.raise(e.what());
    } catch (...) {
      stop.raise("unknown exception");
    }
  };
  std::vector<std::thread> threads;
  for (const std::string& d : devices) threads.emplace_back(worker, d);
  for (auto& t : threads) t.join();
  progress.update(true);
  const double s = progress.seconds();
  std::fprintf(stderr,
               "\nlatent-precompute: %llu clips done, %llu failed, %llu skipped (already done or repeated); "
               "%llu frames -> %llu latents in %.1f s (%.2f clips/s, %.1f frames/s)%s\n",
               (unsigned long long)totals.done.load(), (unsigned long long)totals.failed.load(),
               (unsigned long long)totals.skipped.load(), (unsigned long long)totals.frames.load(),
               (unsigned long long)totals.latents.load(), s, s > 0 ? double(totals.done.load()) / s : 0.0,
               s > 0 ? double(totals.frames.load()) / s : 0.0,
               totals.failed ? ("; failures in " + rank_errors(o.out, o.rank).filename().string()).c_str() : "");
  int code = totals.failed ? kExitFailedClips : 0;
  if (stop.stopped()) {
    std::fprintf(stderr,
                 "latent-precompute: stopped: %s\nThe clips listed in the index are kept; run the same command "
                 "again to go on.\n",
                 stop.why().c_str());
    code = kExitFatal;
  }
  // Everything GStreamer made is gone by now; deinit lets its leaks tracer check that.
  index.reset();
  errors.reset();
  feed.reset();
  gst_deinit();
  return code;
}

// latent-precompute: encodes a dataset of videos to latent files for training, from a CSV manifest or a folder,
// one GStreamer pipeline per clip, resumable, in memory bounded by the clips in flight. docs/precompute.md.
#include <gst/gst.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
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
constexpr int kExitFatal = 3;  // nothing could run: unreadable manifest, output folder, model

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: latent-precompute [options] MANIFEST.csv|VIDEO_DIR OUT_DIR\n"
               "Encodes every clip of the manifest (CSV: path,caption[,start,end,fps]; paths relative to it) or\n"
               "every video of the folder to OUT_DIR/<name>.safetensors, listed in OUT_DIR/index.jsonl; failures\n"
               "go to OUT_DIR/errors.jsonl. A rerun skips the clips already in the index.\n"
               "  --model PATH        the VAE (default: the built-in default model)\n"
               "  --device D          cpu, cuda, cuda:N (default: cpu)\n"
               "  --devices D1,D2     one stream per device, in threads of this process\n"
               "  --dtype T           auto, float32, float16, bfloat16 (default: auto)\n"
               "  --width W --height H  resize and centre-crop every clip to WxH (multiples of 8)\n"
               "  --fps F             resample to F frames/s (a row's fps column wins)\n"
               "  --max-frames N      encode at most N frames of each clip\n"
               "  --rank R --world-size N  take every N-th row from row R (default: $RANK, $WORLD_SIZE)\n"
               "  --timeout S         give a clip up after S seconds (default 3600)\n"
               "exit status: 0 all clips done, 1 some clips failed (see errors.jsonl), 2 bad usage, 3 nothing\n"
               "could run (manifest, output folder or model unusable)\n");
  std::exit(code);
}

struct Options {
  fs::path manifest, out;
  EncodeSettings encode;
  std::vector<std::string> devices{"cpu"};
  uint64_t rank = 0, world = 1;
};

uint64_t env_integer(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  if (auto n = latent::bounded_integer(v, 0, int64_t(1) << 32)) return uint64_t(*n);
  std::fprintf(stderr, "latent-precompute: $%s=\"%s\" is not an integer\n", name, v);
  std::exit(kExitUsage);
}

Options parse(int argc, char** argv) {
  Options o;
  o.rank = env_integer("RANK", 0);
  o.world = env_integer("WORLD_SIZE", 1);
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
    else if (k == "--device")
      o.devices = {value()};
    else if (k == "--devices") {
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
    else if (k == "--rank")
      o.rank = uint64_t(integer(0, int64_t(1) << 32));
    else if (k == "--world-size")
      o.world = uint64_t(integer(1, int64_t(1) << 32));
    else if (k == "--timeout")
      o.encode.timeout_seconds = number(1, 1e7);
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
    } else {
      file_.open(o.manifest);
      if (!file_) throw ManifestError(o.manifest.string() + ": cannot open the manifest");
      reader_.emplace(file_, o.manifest.parent_path());
    }
  }
  // Rows this rank will see, from a first streamed pass (the manifest is read twice, never held): the progress
  // line's total and ETA.
  uint64_t count() const {
    if (!reader_) return owned(folder_.size());
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
        row = folder_[next_folder_++];
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
  std::optional<ManifestReader> reader_;
  std::vector<ClipEntry> folder_;
  size_t next_folder_ = 0;
};

struct Totals {
  std::atomic<uint64_t> done{0}, failed{0}, skipped{0}, frames{0}, latents{0};
};

class Progress {
 public:
  Progress(const Totals& t, uint64_t total)
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
    char eta[48] = "";
    if (worked > 0 && total_ > seen)
      std::snprintf(eta, sizeof eta, ", ETA %.0f s", s / double(worked) * double(total_ - seen));
    std::fprintf(
        stderr, "%s%llu/%llu clips: %llu done, %llu failed, %llu skipped; %llu frames, %.1f frames/s, %.0f s%s%s",
        tty_ ? "\r\033[K" : "", (unsigned long long)seen, (unsigned long long)total_,
        (unsigned long long)t_.done.load(), (unsigned long long)t_.failed.load(), (unsigned long long)t_.skipped.load(),
        (unsigned long long)t_.frames.load(), s > 0 ? double(t_.frames.load()) / s : 0.0, s, eta, tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  const Totals& t_;
  uint64_t total_;
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

}  // namespace

int main(int argc, char** argv) {
  gst_init(&argc, &argv);
  Options o = parse(argc, argv);
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (!fs::is_directory(o.out)) {
    std::fprintf(stderr, "latent-precompute: cannot create %s: %s\n", o.out.c_str(), ec.message().c_str());
    return kExitFatal;
  }
  // One loaded copy of the model per device for the whole run: every clip's vaeencode asks for the same
  // (path, device, dtype) and shares it instead of loading it again.
  std::vector<std::shared_ptr<const latent::Vae>> keep;
  try {
    if (o.encode.model.empty()) o.encode.model = latent::find_default_model().string();
    for (const std::string& d : o.devices) {
      const torch::Device device = latent::resolve_device(d);
      keep.push_back(latent::shared_vae(o.encode.model, {device, latent::resolve_dtype(o.encode.dtype, device)}));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-precompute: cannot load the model: %s\n", e.what());
    return kExitFatal;
  }
  std::unique_ptr<Feed> feed;
  try {
    feed = std::make_unique<Feed>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-precompute: %s\n", e.what());
    return kExitFatal;
  }
  // Temporary twins of clip files a killed run was writing (".<name>.tmp-XXXX"); each is removed when its clip
  // comes up in this run, so another rank's file in progress is never touched.
  std::unordered_map<std::string, std::vector<fs::path>> stale;
  for (const auto& d : fs::directory_iterator(o.out, ec)) {
    const std::string f = d.path().filename().string();
    const size_t tmp = f.rfind(".tmp-");
    if (f.size() > 1 && f[0] == '.' && tmp != std::string::npos) stale[f.substr(1, tmp - 1)].push_back(d.path());
  }
  std::mutex stale_mu;
  auto drop_stale = [&](const std::string& name) {
    std::lock_guard<std::mutex> lock(stale_mu);
    auto it = stale.find(name);
    if (it == stale.end()) return;
    for (const fs::path& p : it->second) fs::remove(p, ec);
    stale.erase(it);
  };
  const fs::path index_path = o.out / "index.jsonl";
  const std::unordered_set<std::string> finished = finished_files(index_path);
  JsonLines index(index_path), errors(o.out / "errors.jsonl");
  std::mutex log_mu;
  Totals totals;
  Progress progress(totals, feed->count());

  auto record_error = [&](uint64_t row, const std::string& source, const std::string& reason) {
    latent::json::Object e{{"row", Value::unsigned_integer(row)}, {"path", source}, {"reason", reason}};
    std::lock_guard<std::mutex> lock(log_mu);
    errors.append(latent::json::dump(Value(std::move(e))));
  };
  auto worker = [&](const std::string& device) {
    EncodeSettings s = o.encode;
    s.device = device;
    while (auto row = feed->next()) {
      if (const auto* bad = std::get_if<RowError>(&*row)) {
        record_error(bad->row, "", "manifest: " + bad->reason);
        totals.failed++;
        progress.update();
        continue;
      }
      const ClipEntry& clip = std::get<ClipEntry>(*row);
      const std::string name = clip_file_name(clip);
      drop_stale(name);
      if (finished.count(name)) {
        totals.skipped++;
        progress.update();
        continue;
      }
      ClipResult r = encode_clip(clip, s, o.out / name);
      if (!r.ok) {
        record_error(clip.row, clip.source, r.reason);
        totals.failed++;
        progress.update();
        continue;
      }
      Value shape;
      std::string model;
      try {
        model = shape_text(o.out / name, shape);
      } catch (const std::exception& e) {
        record_error(clip.row, clip.source, std::string("the written file does not read back: ") + e.what());
        fs::remove(o.out / name, ec);
        totals.failed++;
        continue;
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
        index.append(latent::json::dump(Value(std::move(entry))));
      }
      totals.done++;
      totals.frames += r.frames;
      totals.latents += r.latents;
      progress.update();
    }
  };
  std::vector<std::thread> threads;
  for (const std::string& d : o.devices) threads.emplace_back(worker, d);
  for (auto& t : threads) t.join();
  progress.update(true);
  const double s = progress.seconds();
  std::fprintf(stderr,
               "\nlatent-precompute: %llu clips done, %llu failed, %llu skipped (already in the index); "
               "%llu frames -> %llu latents in %.1f s (%.2f clips/s, %.1f frames/s)%s\n",
               (unsigned long long)totals.done.load(), (unsigned long long)totals.failed.load(),
               (unsigned long long)totals.skipped.load(), (unsigned long long)totals.frames.load(),
               (unsigned long long)totals.latents.load(), s, s > 0 ? double(totals.done.load()) / s : 0.0,
               s > 0 ? double(totals.frames.load()) / s : 0.0, totals.failed ? "; failures in errors.jsonl" : "");
  return totals.failed ? kExitFailedClips : 0;
}

// latent-bench: times the streaming engine on seeded random input and reports throughput, per-chunk latency and
// memory. tools/bench runs it side by side with diffusers; it is also useful alone:
//
//   latent-bench --model build/bench-models/wan2.1 --frames 17 --height 128 --width 128
//                --direction encode --threads 2 --repeat 3 --json
//
// Input. encode: frames ~ U[-1, 1], drawn from a CPU generator seeded with --seed, one push at a time in frame
// order (torch.rand over [T, 3, H, W] in Python gives the same values, so tools/bench feeds diffusers the same
// clip). decode: raw VAE-space latents ~ N(0, 1) of shape [T', C, H/8, W/8] with T' = 1 + (T - 1) / 4, mapped
// to diffusion space before they are pushed (the engine maps them back), so both sides decode the same z.
//
// Memory. The weights of a CPU model are a private mapping of the safetensors file whose pages are faulted in on
// first use; they are touched right after loading so that the baseline holds the whole model, as diffusers'
// does. Then VmRSS is read (the baseline) and the peak (VmHWM) is reset through /proc/self/clear_refs, so the
// reported peak is what the measured runs add, their input included. On CUDA the caching allocator's peak is
// reset the same way.
//
// Patch parallel. --devices cpu,cpu (or cuda:0,cuda:1) runs the stream over ranks as threads of this process.
// Under torchrun (WORLD_SIZE > 1) every process is one rank of the group, on cuda:LOCAL_RANK when --device is
// cuda, and rank 0 prints the report; the output cross-check is summed over the ranks, so it matches one device's:
//
//   torchrun --nproc-per-node 2 --no-python build/bench/latent-bench --model M --device cuda --direction decode
#include <c10/core/InferenceMode.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.h"
#include "io/json.h"
#include "latent/parallel/row_shard.h"
#include "latent/runtime/build_info.h"
#include "latent/runtime/devices.h"
#include "latent/vae/sharded_streaming.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"

namespace {

using namespace latent::bench;
using Clock = std::chrono::steady_clock;
using latent::json::Value;

struct Args {
  std::string model;
  int64_t frames = 17;
  int64_t height = 64;
  int64_t width = 64;
  std::string direction = "encode";
  std::string device = "cpu";
  std::string devices;        // ranks as threads, e.g. cpu,cpu
  int64_t rank_timeout = 60;  // seconds a rank waits for another
  std::string dtype = "auto";
  int threads = 0;  // 0: LibTorch's default
  int repeat = 1;
  int warmup = 0;
  int64_t push = 1;                         // frames (encode) or latents (decode) per push
  int64_t chunk = 0;                        // max frames / latents per model call; 0: the engine's default
  int64_t tile_height = 0, tile_width = 0;  // spatial tiles in pixels (CogVideoX); 0: untiled
  int64_t band_height = 0;                  // exact spatial bands in pixel rows (Wan); 0: whole frames
  std::string dump;                         // raw float32 output, written as it comes out (not timed)
  uint64_t seed = 0;
  bool json = false;
  std::string profile;  // chrome trace of the last repetition
};

[[noreturn]] void usage(int status) {
  std::fprintf(status ? stderr : stdout,
               "usage: latent-bench --model DIR|FILE [--frames N] [--height H] [--width W]\n"
               "                    [--direction encode|decode] [--device cpu|cuda|cuda:N] [--devices D0,D1,...]\n"
               "                    [--rank-timeout S] [--dtype auto|float32|...]\n"
               "                    [--threads T] [--repeat R] [--warmup W] [--push P] [--chunk C] [--seed S]\n"
               "                    [--tile HxW] [--band H] [--dump OUT.f32] [--profile TRACE.json] [--json]\n"
               "  --devices    one stream over ranks as threads, one per entry (patch parallel)\n"
               "  --frames     clip length in frames (decode: the frames the latents stand for, 1 + 4k)\n"
               "  --push       frames (encode) or latents (decode) handed to each push(), as a live source would\n"
               "  --chunk      most frames (encode) / latents (decode) per model call where the family batches\n"
               "  --tile       spatial tiles of H x W pixels with diffusers' overlaps (CogVideoX's enable_tiling)\n"
               "  --band       exact spatial bands of H pixel rows (a multiple of the spatial factor; Wan family):\n"
               "               each band is computed from a crop with its halo, only the latent attention sees the\n"
               "               whole frame; same output as whole frames\n"
               "  --dump       write the output (encode: VAE-space latents, decode: frames) as raw float32 in\n"
               "               [T, C, H, W] order, outside the timed spans, for comparing runs"
               "  --warmup     untimed runs of the same clip before the baseline is taken\n"
               "  --profile    write PyTorch's profiler trace (Chrome format) of the last repetition: CPU operators\n"
               "               and, on a GPU, its kernels and copies\n");
  std::exit(status);
}

Args parse_args(int argc, char** argv) {
  Args a;
  ArgReader r("latent-bench", argc, argv, usage);
  constexpr int64_t kBig = int64_t(1) << 40;
  while (r.next_key()) {
    const std::string& k = r.key();
    if (k == "--help" || k == "-h")
      usage(0);
    else if (k == "--model")
      a.model = r.value();
    else if (k == "--frames")
      a.frames = r.integer(1, kBig);
    else if (k == "--height")
      a.height = r.integer(1, kBig);
    else if (k == "--width")
      a.width = r.integer(1, kBig);
    else if (k == "--direction")
      a.direction = r.value();
    else if (k == "--device")
      a.device = r.value();
    else if (k == "--devices")
      a.devices = r.value();
    else if (k == "--rank-timeout")
      a.rank_timeout = r.integer(1, 24 * 3600);
    else if (k == "--dtype")
      a.dtype = r.value();
    else if (k == "--threads")
      a.threads = int(r.integer(0, 1024));
    else if (k == "--repeat")
      a.repeat = int(r.integer(1, 1 << 20));
    else if (k == "--warmup")
      a.warmup = int(r.integer(0, 1 << 20));
    else if (k == "--push")
      a.push = r.integer(1, kBig);
    else if (k == "--chunk")
      a.chunk = r.integer(0, kBig);
    else if (k == "--tile") {
      const std::string v = r.value();
      const auto x = v.find('x');
      if (x == std::string::npos) r.fail("wants HxW in pixels");
      try {
        a.tile_height = std::stoll(v.substr(0, x));
        a.tile_width = std::stoll(v.substr(x + 1));
      } catch (const std::exception&) {
        r.fail("wants HxW in pixels");
      }
    } else if (k == "--band")
      a.band_height = r.integer(0, kBig);
    else if (k == "--dump")
      a.dump = r.value();
    else if (k == "--seed")
      a.seed = uint64_t(r.integer(0, kBig));
    else if (k == "--json")
      a.json = true;
    else if (k == "--profile")
      a.profile = r.value();
    else
      r.fail("is not an option");
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "latent-bench: --model is required\n");
    usage(2);
  }
  if (a.direction != "encode" && a.direction != "decode") {
    std::fprintf(stderr, "latent-bench: --direction is encode or decode\n");
    usage(2);
  }
  if (a.frames < 1 || a.height < 1 || a.width < 1 || a.repeat < 1 || a.warmup < 0 || a.push < 1 || a.chunk < 0 ||
      a.threads < 0) {
    std::fprintf(stderr, "latent-bench: sizes, --repeat and --push must be positive\n");
    usage(2);
  }
  return a;
}

// ---- one run -------------------------------------------------------------------------------------------------

struct RunResult {
  double wall = 0;                  // seconds spent in push() and finish()
  double cpu = 0;                   // process CPU seconds (all threads) spent there
  std::vector<double> chunk_times;  // push()/finish() calls that returned output
  double first_output = 0;          // seconds from the first push to the first output
  int64_t outputs = 0;              // latents (encode) or frames (decode) out
  size_t state_bytes_max = 0;
  size_t state_bytes_end = 0;  // after the last push, before finish()
  size_t heap_bytes_end = 0;   // the stream's activation heap, same moment
  double abs_sum = 0;          // of the VAE-space output, a cross-check with the reference
  int64_t elements = 0;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

class Bench {
 public:
  Bench(const Args& args, std::shared_ptr<const latent::Vae> vae, std::vector<std::shared_ptr<const latent::Vae>> ranks,
        std::shared_ptr<const latent::parallel::RowShard> shard)
      : a_(args), vae_(std::move(vae)), ranks_(std::move(ranks)), shard_(std::move(shard)) {
    if (ranks_.empty()) ranks_ = {vae_};  // one device
  }

  int64_t latent_count() const { return 1 + (a_.frames - 1) / vae_->spec().temporal_factor; }

  RunResult run() {
    open_dump();
    RunResult r = a_.direction == "encode" ? run_encode() : run_decode();
    if (dump_) {
      dump_->close();
      if (!*dump_) throw std::runtime_error("writing " + a_.dump + " failed");
      dump_.reset();
    }
    return r;
  }

 private:
  // Where the stream's input goes and its output comes from: the first rank's device, which is --device's only
  // when --devices starts with it (--devices cuda:0,cuda:0 alone leaves --device at the CPU).
  torch::Device device() const { return ranks_.front()->device(); }

  void record(RunResult& r, double dt, double cpu, Clock::time_point start, bool produced) {
    r.wall += dt;
    r.cpu += cpu;
    if (produced) {
      r.chunk_times.push_back(dt);
      if (r.chunk_times.size() == 1) r.first_output = seconds_since(start);
    }
  }

  void check(RunResult& r, const torch::Tensor& t) {
    r.abs_sum += t.to(torch::kDouble).abs().sum().item<double>();
    r.elements += t.numel();
    if (dump_) {
      const torch::Tensor c = t.to(torch::kCPU, torch::kFloat).contiguous();
      dump_->write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.numel() * sizeof(float)));
    }
  }

  // Each run rewrites the dump, so it holds the last repetition's output.
  void open_dump() {
    if (a_.dump.empty()) return;
    dump_ = std::make_unique<std::ofstream>(a_.dump, std::ios::binary | std::ios::trunc);
    if (!*dump_) throw std::runtime_error("cannot write " + a_.dump);
  }

  RunResult run_encode() {
    const latent::VaeSpec& spec = vae_->spec();
    latent::EncoderOptions opt;
    if (a_.chunk > 0) opt.max_chunk_frames = a_.chunk;
    opt.tile.height = a_.tile_height;
    opt.tile.width = a_.tile_width;
    opt.bands.height = a_.band_height;
    opt.shard = shard_;
    const auto stream = latent::open_encoder(ranks_, opt, group());
    latent::EncoderStream& enc = *stream;
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a_.seed);
    const auto fopts = torch::TensorOptions().dtype(torch::kFloat);
    const torch::Tensor shift = spec.latent_shift.to(device(), torch::kDouble).reshape({1, -1, 1, 1});
    const torch::Tensor scale = spec.latent_scale.to(device(), torch::kDouble).reshape({1, -1, 1, 1});
    RunResult r;
    const auto start = Clock::now();
    auto consume = [&](latent::EncodedLatents&& out) {
      if (out.size() == 0) return false;
      r.outputs += out.size();
      // Back to VAE space (what diffusers' latent_dist.mean is) for the cross-check.
      check(r, out.latents.to(torch::kDouble) / scale + shift);
      return true;
    };
    for (int64_t done = 0; done < a_.frames;) {
      const int64_t n = std::min(a_.push, a_.frames - done);
      torch::Tensor frames = torch::rand({n, 3, a_.height, a_.width}, gen, fopts).mul_(2).sub_(1);
      if (!device().is_cpu()) frames = frames.to(device());
      synchronize(device());
      const double c0 = process_cpu_seconds();
      const auto t0 = Clock::now();
      latent::EncodedLatents out = enc.push(frames);
      synchronize(device());
      const double dt = seconds_since(t0);
      r.state_bytes_max = std::max(r.state_bytes_max, enc.state_bytes());
      record(r, dt, process_cpu_seconds() - c0, start, out.size() > 0);
      consume(std::move(out));
      done += n;
    }
    r.state_bytes_end = enc.state_bytes();
    r.heap_bytes_end = enc.heap_bytes();
    const double c0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    latent::EncodedLatents tail = enc.finish();
    synchronize(device());
    record(r, seconds_since(t0), process_cpu_seconds() - c0, start, tail.size() > 0);
    consume(std::move(tail));
    return r;
  }

  RunResult run_decode() {
    const latent::VaeSpec& spec = vae_->spec();
    latent::DecoderOptions opt;
    if (a_.chunk > 0) opt.max_chunk_latents = a_.chunk;
    opt.tile.height = a_.tile_height;
    opt.tile.width = a_.tile_width;
    opt.bands.height = a_.band_height;
    opt.shard = shard_;
    const auto stream = latent::open_decoder(ranks_, opt, group());
    latent::DecoderStream& dec = *stream;
    const int64_t s = spec.spatial_factor;
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a_.seed);
    // Raw VAE-space latents, then diffusion space: the engine maps them back before decoding.
    torch::Tensor z = torch::randn({latent_count(), spec.latent_channels, a_.height / s, a_.width / s}, gen,
                                   torch::TensorOptions().dtype(torch::kFloat));
    z = (z - spec.latent_shift.reshape({1, -1, 1, 1})) * spec.latent_scale.reshape({1, -1, 1, 1});
    z = z.to(device(), ranks_.front()->dtype());
    RunResult r;
    const auto start = Clock::now();
    auto consume = [&](const torch::Tensor& frames) {
      if (!frames.defined() || frames.size(0) == 0) return false;
      r.outputs += frames.size(0);
      check(r, frames);
      return true;
    };
    for (int64_t done = 0; done < z.size(0);) {
      const int64_t n = std::min(a_.push, z.size(0) - done);
      torch::Tensor piece = z.slice(0, done, done + n);
      synchronize(device());
      const double c0 = process_cpu_seconds();
      const auto t0 = Clock::now();
      torch::Tensor frames = dec.push(piece);
      synchronize(device());
      const double dt = seconds_since(t0);
      r.state_bytes_max = std::max(r.state_bytes_max, dec.state_bytes());
      const bool produced = frames.defined() && frames.size(0) > 0;
      record(r, dt, process_cpu_seconds() - c0, start, produced);
      consume(frames);
      done += n;
    }
    r.state_bytes_end = dec.state_bytes();
    r.heap_bytes_end = dec.heap_bytes();
    const double c0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    torch::Tensor tail = dec.finish();
    synchronize(device());
    const bool produced = tail.defined() && tail.size(0) > 0;
    record(r, seconds_since(t0), process_cpu_seconds() - c0, start, produced);
    consume(tail);
    return r;
  }

  latent::parallel::GroupOptions group() const {
    latent::parallel::GroupOptions g;
    g.timeout = std::chrono::seconds(a_.rank_timeout);
    return g;
  }

  const Args& a_;
  std::shared_ptr<const latent::Vae> vae_;
  std::vector<std::shared_ptr<const latent::Vae>> ranks_;
  std::shared_ptr<const latent::parallel::RowShard> shard_;
  std::unique_ptr<std::ofstream> dump_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

Value reals(const std::vector<double>& v) {
  latent::json::Array a;
  for (double x : v) a.push_back(Value::real(x));
  return Value(std::move(a));
}

const char* dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

int run(const Args& a) {
  if (a.threads > 0) torch::set_num_threads(a.threads);
  // Ranks as processes (torchrun): this process is one of them, on its local GPU.
  std::shared_ptr<const latent::parallel::RowShard> shard;
  std::string device_name = a.device;
  if (latent::parallel::LaunchEnv::present()) {
    const auto env = latent::parallel::LaunchEnv::read();
    if (env.world > 1) {
      if (device_name.rfind("cuda", 0) == 0) device_name = "cuda:" + std::to_string(env.local_rank);
      latent::parallel::GroupOptions group;
      group.timeout = std::chrono::seconds(a.rank_timeout);
      shard = std::make_shared<latent::parallel::RowShard>(latent::parallel::join_tcp(
          env.host, env.port, env.rank, env.world, latent::resolve_device(device_name), group));
    }
  }
  const torch::Device device = latent::resolve_device(device_name);
  const torch::ScalarType dtype = latent::resolve_dtype(a.dtype, device);
  c10::InferenceMode inference;

  const int64_t rss_start = proc_status_bytes("VmRSS");
  const auto t_load = Clock::now();
  std::shared_ptr<const latent::Vae> vae = latent::load_vae(a.model, {device, dtype});
  synchronize(device);
  const double load_seconds = seconds_since(t_load);
  vae->check_frame_size(a.width, a.height);
  // Ranks as threads: one model per listed device (shared where a device repeats).
  std::vector<std::shared_ptr<const latent::Vae>> ranks;
  if (!a.devices.empty()) {
    std::stringstream list(a.devices);
    for (std::string d; std::getline(list, d, ',');) {
      const torch::Device dev = latent::resolve_device(d);
      ranks.push_back(dev == device ? vae : latent::load_vae(a.model, {dev, dtype}));
    }
  }
  const latent::VaeSpec& spec = vae->spec();
  if (a.direction == "decode" && (a.frames - 1) % spec.temporal_factor != 0) {
    throw std::invalid_argument("--direction decode wants --frames 1 + " + std::to_string(spec.temporal_factor) +
                                "k (the frames a whole number of latents stands for)");
  }
  // No prefaulting here: loading already made the weights the model keeps resident and released the rest
  // (latent::settle_residency), so the baseline below is the memory a real process holds after loading.

  const int64_t band_rows = latent::band_latent_rows(*vae, latent::BandOptions{a.band_height});
  const int64_t band_halo =
      a.band_height > 0 ? vae->band_halo(a.direction == "encode" ? latent::VaeState::Role::encoder
                                                                 : latent::VaeState::Role::decoder)
                        : 0;
  Bench bench(a, vae, ranks, shard);
  for (int i = 0; i < a.warmup; ++i) bench.run();

  const int64_t rss_baseline = proc_status_bytes("VmRSS");
  const bool hwm_reset = reset_peak_rss();
  synchronize(device);
  reset_gpu_peak(device);
  const int64_t gpu_baseline = gpu_allocated_now(device);

  std::vector<double> walls, cpus, fps, chunk_means, chunk_max, first_out;
  RunResult last;
  size_t state_max = 0, state_end_max = 0, heap_end_max = 0;
  for (int i = 0; i < a.repeat; ++i) {
    const bool profiling = !a.profile.empty() && i == a.repeat - 1;
    if (profiling) start_profiler(device);
    last = bench.run();
    if (profiling) stop_profiler(a.profile);
    walls.push_back(last.wall);
    cpus.push_back(last.cpu);
    fps.push_back(double(a.frames) / last.wall);
    chunk_means.push_back(mean(last.chunk_times));
    chunk_max.push_back(last.chunk_times.empty() ? 0
                                                 : *std::max_element(last.chunk_times.begin(), last.chunk_times.end()));
    first_out.push_back(last.first_output);
    state_max = std::max(state_max, last.state_bytes_max);
    state_end_max = std::max(state_end_max, last.state_bytes_end);
    heap_end_max = std::max(heap_end_max, last.heap_bytes_end);
  }
  if (shard) {  // the cross-check over the whole frame
    torch::Tensor sums = torch::tensor({last.abs_sum, double(last.elements)}, torch::kDouble).to(device);
    shard->all_reduce(sums);
    last.abs_sum = sums[0].item<double>();
    last.elements = int64_t(sums[1].item<double>());
  }
  const int64_t rss_peak = proc_status_bytes("VmHWM");
  const int64_t rss_end = proc_status_bytes("VmRSS");
  const int64_t expected_out = a.direction == "encode" ? bench.latent_count() : a.frames;

  latent::json::Object o{
      {"impl", "gst-latent"},
      {"model", a.model},
      {"family", spec.family},
      {"direction", a.direction},
      {"device", device.str()},
      {"ranks", Value::integer(shard ? shard->world() : std::max<int64_t>(1, int64_t(ranks.size())))},
      {"devices", a.devices},
      {"dtype", dtype_name(dtype)},
      {"frames", Value::integer(a.frames)},
      {"height", Value::integer(a.height)},
      {"width", Value::integer(a.width)},
      {"latents", Value::integer(bench.latent_count())},
      {"push", Value::integer(a.push)},
      {"chunk", Value::integer(a.chunk)},
      {"tile_height", Value::integer(a.tile_height)},
      {"tile_width", Value::integer(a.tile_width)},
      // Exact bands: pixel rows per band (0: whole frames), in latent rows, and the halo each band recomputes
      // (pixels when encoding, latent rows when decoding).
      {"band_height", Value::integer(a.band_height)},
      {"band_rows", Value::integer(band_rows)},
      {"band_halo", Value::integer(band_halo)},
      {"dump", a.dump},
      {"seed", Value::unsigned_integer(a.seed)},
      {"threads", Value::integer(torch::get_num_threads())},
      {"interop_threads", Value::integer(torch::get_num_interop_threads())},
      {"runtime", latent::runtime_summary()},
      {"repeat", Value::integer(a.repeat)},
      {"warmup", Value::integer(a.warmup)},
      {"load_seconds", Value::real(load_seconds)},
      {"wall_seconds", reals(walls)},
      {"wall_seconds_median", Value::real(median(walls))},
      // CPU seconds of all threads over the same spans; cpu / (wall * threads) near 1 means the cores were ours.
      {"cpu_seconds", reals(cpus)},
      {"fps", reals(fps)},
      {"fps_median", Value::real(median(fps))},
      {"chunks", Value::integer(int64_t(last.chunk_times.size()))},
      {"chunk_latency_mean_seconds", Value::real(median(chunk_means))},
      {"chunk_latency_max_seconds", Value::real(median(chunk_max))},
      {"first_output_seconds", Value::real(median(first_out))},
      {"outputs", Value::integer(last.outputs)},
      {"outputs_expected", Value::integer(expected_out)},
      {"output_mean_abs", Value::real(last.elements ? last.abs_sum / double(last.elements) : 0.0)},
      {"state_bytes", Value::integer(int64_t(state_max))},
      {"state_bytes_end", Value::integer(int64_t(state_end_max))},
      // Activation memory the stream keeps between chunks (core/src/heap.h), part of the RSS above.
      {"heap_bytes", Value::integer(int64_t(heap_end_max))},
      {"rss_start_bytes", Value::integer(rss_start)},
      {"rss_baseline_bytes", Value::integer(rss_baseline)},
      {"rss_peak_bytes", Value::integer(rss_peak)},
      {"rss_peak_above_baseline_bytes", Value::integer(rss_peak - rss_baseline)},
      {"rss_end_bytes", Value::integer(rss_end)},
      {"rss_peak_reset", hwm_reset},
  };
  if (auto g = gpu_memory(device, gpu_baseline)) o.emplace_back("gpu_memory", std::move(*g));
  if (!a.profile.empty()) o.emplace_back("profile", a.profile);

  if (shard && shard->rank() != 0) return last.outputs == expected_out ? 0 : 1;  // rank 0 reports
  if (a.json) {
    std::printf("%s\n", latent::json::dump(Value(std::move(o))).c_str());
  } else {
    const double mib = 1024.0 * 1024.0;
    std::printf("%s %s %s %s %lldx%lldx%lld, %d threads, push %lld\n", spec.family.c_str(), a.direction.c_str(),
                device.str().c_str(), dtype_name(dtype), (long long)a.frames, (long long)a.height, (long long)a.width,
                torch::get_num_threads(), (long long)a.push);
    for (size_t i = 0; i < walls.size(); ++i)
      std::printf("  run %zu: %.3f s, %.2f frames/s, chunk latency mean %.3f s (max %.3f s)\n", i, walls[i], fps[i],
                  chunk_means[i], chunk_max[i]);
    std::printf("  median %.2f frames/s; %lld chunks; %lld of %lld outputs; output mean |x| %.6g\n", median(fps),
                (long long)last.chunk_times.size(), (long long)last.outputs, (long long)expected_out,
                last.elements ? last.abs_sum / double(last.elements) : 0.0);
    std::printf("  load %.2f s; RSS baseline %.1f MiB, peak %.1f MiB (+%.1f MiB%s); state %.2f MiB\n", load_seconds,
                double(rss_baseline) / mib, double(rss_peak) / mib, double(rss_peak - rss_baseline) / mib,
                hwm_reset ? "" : ", peak not reset after load", double(state_max) / mib);
  }
  if (last.outputs != expected_out) {
    std::fprintf(stderr, "latent-bench: %lld outputs, expected %lld\n", (long long)last.outputs,
                 (long long)expected_out);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-bench: %s\n", e.what());
    return 1;
  }
}

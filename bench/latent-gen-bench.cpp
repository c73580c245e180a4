// latent-gen-bench: times video generation as `videogen ! vaedecode` runs it, without GStreamer: a Generator
// under a schedule hands out latents, and a StreamingDecoder turns each into frames as it comes. Reports latent
// frames/s (generation alone), video frames/s end to end, model calls, the time to the first latent, and memory
// against length: the RSS after every --sample latents, so a run of 2,000 latents shows whether memory is flat.
// tools/bench --generate runs it next to an eager PyTorch reference; it is also useful alone:
//
//   latent-gen-bench --generator models/latent-gen-small.safetensors --vae models/latent-tiny-wan.safetensors
//                    --latents 500 --schedule fifo --threads 2 --json
//
// Memory: the baseline is VmRSS after both models are loaded; the peak (VmHWM) is reset then, so the reported
// peak is what generating and decoding add (the process's peak up to then is reported apart).
//
// A text-conditioned denoiser (a diffusers Wan folder) takes its prompt embeddings from --text, a safetensors file
// with "text" and, for guidance, "negative_text" [1, L, D]. tools/bench --generate --native times one clip that
// way next to diffusers' WanPipeline; --save-latents keeps the result so the two outputs can be compared.
//
// --devices cpu,cpu[,...] generates on several ranks (threads of this process, a ParallelGenerator) as videogen's
// devices= does, under --parallel (videogen's parallel= syntax, or auto). Ranks on one device share one loaded
// model. OpenMP gives every rank thread the process default (OMP_NUM_THREADS), not --threads: tools/bench
// --generate --devices sets both. Per-call times are not kept then (the ranks call at once); a step's time is
// the loop's wall time over its iterations.
//
// --schedule causal runs a causal few-step model (Self-Forcing, LongLive) a block at a time over its key/value
// cache: --chunk latent frames a block, --denoising-steps on the 1000-step grid, a window of --kv-window frames
// with --sink frames kept. Each next() is one block, so next_seconds holds the block times and the first one is
// the time to the first latent. tools/bench --generate --causal runs it next to the reference's own loop.
#include <c10/core/InferenceMode.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <sys/resource.h>
#include <algorithm>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "bench_support.h"
#include "io/json.h"
#include "latent/gen/generator.h"
#include "latent/gen/parallel_generator.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/build_info.h"
#include "latent/runtime/devices.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"

namespace {

using namespace latent::bench;
using Clock = std::chrono::steady_clock;
using latent::json::Value;

struct Args {
  std::string generator, vae, text, save_latents, profile_out;
  int64_t profile_iteration = -1;  // < 0: no profile
  double guidance = -1;  // < 0: the denoiser's
  int64_t latents = 100;
  std::string schedule = "fifo";
  int64_t steps = 0, window = 0, context = -1, height = 0, width = 0, sample = 0;
  std::string device = "cpu", dtype = "auto";
  std::string devices, parallel = "auto";
  int64_t chunk = 3, kv_window = 0, sink = 0;  // causal
  std::vector<int64_t> denoising_steps{1000, 750, 500, 250};
  int threads = 0;
  uint64_t seed = 0;
  bool json = false;
};

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: latent-gen-bench --generator FILE [--vae FILE] [--latents N] [--schedule clip|fifo|rolling]\n"
               "                        [--steps K] [--window W] [--context C] [--height h] [--width w]\n"
               "                        [--device D] [--dtype T] [--threads N] [--seed S] [--sample K] [--json]\n"
               "                        [--text FILE] [--guidance G] [--save-latents FILE]\n"
               "                        [--devices D,D[,...]] [--parallel cfg=N,ulysses=N,partitions=N|auto]\n"
               "                        [--chunk N] [--kv-window N] [--sink N] [--denoising-steps S,S,...]\n"
               "  --vae      decode every latent as it comes (the VAE whose latent space the generator names);\n"
               "             without it only generation is timed\n"
               "  --text     safetensors with \"text\" (and \"negative_text\" for guidance) prompt embeddings\n"
               "             [1, L, D], for a text-conditioned denoiser\n"
               "  --guidance classifier-free guidance scale (default: the denoiser's; 1 runs one call per step)\n"
               "  --save-latents  write every generated latent, in order, as \"latents\" [1, C, N, h, w] float32\n"
               "  --profile-iteration N --profile-out FILE  the profiler's Chrome trace of iteration N (0: the first;\n"
               "             with --schedule causal one block): CPU operators and, on a GPU, its kernels and copies\n"
               "  --height, --width  latent size (default: the generator's native size)\n"
               "  --steps, --window  0: the generator's; --context -1: a quarter of the window (rolling)\n"
               "  --sample   read the RSS after every K latents (default: latents / 10)\n"
               "  --devices  one rank per entry (threads of this process; ranks on one device share the model),\n"
               "             as videogen devices=; set OMP_NUM_THREADS to the threads each rank should use\n"
               "  --parallel how the ranks share each iteration's model calls (product = ranks), or auto\n"
               "             (latent::choose_plan)\n"
               "  --schedule causal: blocks of --chunk latent frames (default 3), --denoising-steps on the\n"
               "             1000-step grid (default 1000,750,500,250), --kv-window frames of keys and values (0: the\n"
               "             model's trained clip) of which --sink are kept; no guidance\n");
  std::exit(code);
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

Args parse_args(int argc, char** argv) {
  Args a;
  ArgReader r("latent-gen-bench", argc, argv, usage);
  constexpr int64_t kBig = int64_t(1) << 40;
  while (r.next_key()) {
    const std::string& k = r.key();
    if (k == "--help" || k == "-h") usage(0);
    if (k == "--generator")
      a.generator = r.value();
    else if (k == "--vae")
      a.vae = r.value();
    else if (k == "--latents")
      a.latents = r.integer(1, kBig);
    else if (k == "--schedule")
      a.schedule = r.value();
    else if (k == "--steps")
      a.steps = r.integer(0, 1000);
    else if (k == "--window")
      a.window = r.integer(0, 4096);
    else if (k == "--context")
      a.context = r.integer(-1, 4095);
    else if (k == "--height")
      a.height = r.integer(0, 65536);
    else if (k == "--width")
      a.width = r.integer(0, 65536);
    else if (k == "--device")
      a.device = r.value();
    else if (k == "--devices")
      a.devices = r.value();
    else if (k == "--parallel")
      a.parallel = r.value();
    else if (k == "--dtype")
      a.dtype = r.value();
    else if (k == "--threads")
      a.threads = int(r.integer(0, 1024));
    else if (k == "--seed")
      a.seed = uint64_t(r.integer(0, kBig));
    else if (k == "--sample")
      a.sample = r.integer(1, kBig);
    else if (k == "--json")
      a.json = true;
    else if (k == "--text")
      a.text = r.value();
    else if (k == "--save-latents")
      a.save_latents = r.value();
    else if (k == "--profile-iteration")
      a.profile_iteration = r.integer(0, 1 << 20);
    else if (k == "--profile-out")
      a.profile_out = r.value();
    else if (k == "--chunk")
      a.chunk = r.integer(1, 4096);
    else if (k == "--kv-window")
      a.kv_window = r.integer(0, 4096);
    else if (k == "--sink")
      a.sink = r.integer(0, 4095);
    else if (k == "--denoising-steps") {
      a.denoising_steps.clear();
      const std::string v = r.value();
      for (const std::string& item : split_commas(v)) {
        const auto step = latent::bounded_integer(item, 0, 1000);
        if (!step) r.fail("wants steps in [0, 1000] separated by commas, got '" + v + "'");
        a.denoising_steps.push_back(*step);
      }
    } else if (k == "--guidance") {
      const std::string v = r.value();
      const auto g = latent::bounded_number(v, 0.0, 1e6);
      if (!g) r.fail("wants a number >= 0, got '" + v + "'");
      a.guidance = *g;
    } else
      r.fail("is not an option");
  }
  if ((a.profile_iteration >= 0) != !a.profile_out.empty()) {
    std::fprintf(stderr, "latent-gen-bench: --profile-iteration and --profile-out go together\n");
    std::exit(2);
  }
  if (a.generator.empty()) {
    std::fprintf(stderr, "latent-gen-bench: --generator is required\n");
    usage(2);
  }
  if (a.sample == 0) a.sample = std::max<int64_t>(1, a.latents / 10);
  return a;
}

// videogen's parallel= syntax: "cfg=2,ulysses=1,partitions=2" (missing ones are 1); nullopt for "auto".
std::optional<latent::ParallelPlan> parse_plan(const std::string& text) {
  if (text.empty() || text == "auto") return std::nullopt;
  latent::ParallelPlan plan;
  for (const std::string& item : split_commas(text)) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    int* field = key == "cfg"          ? &plan.cfg
                 : key == "ulysses"    ? &plan.ulysses
                 : key == "partitions" ? &plan.partitions
                                       : nullptr;
    const auto v = eq == std::string::npos ? std::nullopt : latent::bounded_number(item.substr(eq + 1), 1.0, 4096.0);
    if (!field || !v || *v != double(int(*v)))
      throw std::invalid_argument("--parallel '" + text + "': '" + item + "' is not cfg=N, ulysses=N or partitions=N");
    *field = int(*v);
  }
  return plan;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// User plus system CPU time of the process: set against the wall time it tells whether other processes took the
// cores during a measurement.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Times every model call: the Generator steps inside next(), so a clip's per-step times are only visible from the
// denoiser's side. The inner predict() finds its inputs already checked and placed, so the wrapper adds no work.
class TimedDenoiser : public latent::Denoiser {
 public:
  explicit TimedDenoiser(std::shared_ptr<const latent::Denoiser> inner)
      : Denoiser(inner->spec(), {inner->device(), inner->dtype()}), inner_(std::move(inner)) {}
  const std::vector<double>& call_seconds() const { return calls_; }
  const std::shared_ptr<const latent::Denoiser>& inner() const { return inner_; }

 protected:
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const override {
    const auto t0 = Clock::now();
    torch::Tensor out = inner_->predict(x, timesteps, text);
    synchronize(inner_->device());
    calls_.push_back(seconds_since(t0));
    return out;
  }

 private:
  std::shared_ptr<const latent::Denoiser> inner_;
  mutable std::vector<double> calls_;
};

latent::json::Array reals(const std::vector<double>& v) {
  latent::json::Array out;
  for (double x : v) out.push_back(Value::real(x));
  return out;
}

latent::json::Array integers(const std::vector<int64_t>& v) {
  latent::json::Array out;
  for (int64_t x : v) out.push_back(Value::integer(x));
  return out;
}

latent::GeneratorOptions generator_options(const Args& a, const latent::DenoiserSpec& spec) {
  latent::GeneratorOptions o;
  o.schedule = latent::parse_schedule_kind(a.schedule);
  o.sampler = spec.sampler;
  if (a.steps > 0) o.sampler.steps = a.steps;
  o.guidance = a.guidance >= 0 ? a.guidance : spec.guidance;
  if (o.schedule == latent::ScheduleKind::causal) {
    // A causal few-step model runs without guidance: the folder's default scale is its bidirectional parent's.
    if (a.guidance < 0) o.guidance = 1.0;
    o.causal.chunk_frames = a.chunk;
    o.causal.kv_window = a.kv_window;
    o.causal.sink_frames = a.sink;
    o.causal.denoising_steps = a.denoising_steps;
  }
  if (!a.text.empty()) {
    const latent::SafetensorsFile f = latent::SafetensorsFile::open(a.text);
    o.text = f.tensor("text");
    if (f.contains("negative_text")) o.negative_text = f.tensor("negative_text");
  }
  o.seed = a.seed;
  o.window = a.window;
  o.height = a.height > 0 ? a.height : spec.native_height;
  o.width = a.width > 0 ? a.width : spec.native_width;
  const int64_t window = a.window > 0 ? a.window : latent::default_window(spec);
  if (o.schedule == latent::ScheduleKind::rolling)
    o.context = a.context >= 0 ? a.context : std::max<int64_t>(1, window / 4);
  o.frames = a.latents;
  return o;
}

int run(const Args& a) {
  if (a.threads > 0) torch::set_num_threads(a.threads);
  const torch::Device device = latent::resolve_device(a.device);
  const torch::ScalarType dtype = latent::resolve_dtype(a.dtype, device);
  c10::InferenceMode inference;

  const auto t_load = Clock::now();
  auto timed = std::make_shared<TimedDenoiser>(latent::load_denoiser(a.generator, {device, dtype}));
  std::shared_ptr<const latent::Denoiser> model = timed;
  std::shared_ptr<const latent::Vae> vae;
  if (!a.vae.empty()) {
    vae = latent::load_vae(a.vae, {device, dtype});
    if (vae->spec().model_id != model->spec().latent_space)
      throw std::invalid_argument("the generator makes latents of '" + model->spec().latent_space + "', the VAE is '" +
                                  vae->spec().model_id + "'");
  }
  synchronize(device);
  const double load_seconds = seconds_since(t_load);

  // With --devices: one model per distinct device (ranks on one device share it, as videogen's do), rank 0's first.
  std::vector<std::shared_ptr<const latent::Denoiser>> ranks;
  std::optional<latent::ParallelPlan> plan;
  if (!a.devices.empty()) {
    std::vector<std::pair<torch::Device, std::shared_ptr<const latent::Denoiser>>> loaded;
    for (const std::string& name : split_commas(a.devices)) {
      const torch::Device d = latent::resolve_device(name);
      auto same = std::find_if(loaded.begin(), loaded.end(), [&](const auto& p) { return p.first == d; });
      if (same == loaded.end()) {
        // Rank 0's device is --device's model already loaded above (its timing wrapper is left out: the ranks
        // would record calls from several threads at once).
        auto m = d == device ? timed->inner() : latent::load_denoiser(a.generator, {d, dtype});
        same = loaded.insert(loaded.end(), {d, m});
      }
      ranks.push_back(same->second);
    }
  }
  const latent::GeneratorOptions options = generator_options(a, model->spec());
  // The causal schedule runs the model's own cached path, which the timing wrapper does not have: its block
  // times are next()'s.
  if (options.schedule == latent::ScheduleKind::causal) model = timed->inner();
  std::unique_ptr<latent::Generator> one;
  std::unique_ptr<latent::ParallelGenerator> many;
  if (ranks.size() > 1) {
    plan = parse_plan(a.parallel);
    if (!plan)
      plan = latent::choose_plan(int(ranks.size()), model->spec(), options.guidance, ranks.front()->attention_heads(),
                                 options.schedule, options.sampler.steps, options.window);
    if (plan->world() != int(ranks.size()))
      throw std::invalid_argument("--parallel '" + a.parallel + "' needs " + std::to_string(plan->world()) +
                                  " devices; --devices lists " + std::to_string(ranks.size()));
    latent::parallel::GroupOptions group;
    group.timeout = std::chrono::minutes(10);  // a share of a guided call on shared cores can take minutes
    many = std::make_unique<latent::ParallelGenerator>(ranks, options, *plan, group);
  } else {
    if (a.parallel != "auto") throw std::invalid_argument("--parallel needs --devices with two or more ranks");
    one = std::make_unique<latent::Generator>(ranks.empty() ? model : ranks.front(), options);
  }
  const auto gen_next = [&] { return one ? one->next() : many->next(); };
  const auto gen_finished = [&] { return one ? one->finished() : many->finished(); };
  const auto gen_state = [&] { return one ? one->state_bytes() : many->state_bytes(); };
  const auto gen_calls = [&] { return one ? one->model_calls() : many->model_calls(); };
  std::unique_ptr<latent::StreamingDecoder> decoder;
  if (vae) decoder = std::make_unique<latent::StreamingDecoder>(vae);
  const int64_t tf = model->spec().temporal_factor;

  const int64_t rss_baseline = proc_status_bytes("VmRSS");
  const int64_t rss_peak_loading = proc_status_bytes("VmHWM");
  const bool hwm_reset = reset_peak_rss();
  std::vector<torch::Tensor> kept;
  double gen_cpu_seconds = 0;
  double gen_seconds = 0, decode_seconds = 0, first_latent = 0;
  int64_t latents = 0, frames = 0;
  size_t state_max = 0;
  latent::json::Array samples;
  const auto start = Clock::now();
  const auto decode = [&](const torch::Tensor& z, int64_t real) {
    const auto t0 = Clock::now();
    torch::Tensor out = real < 0 ? decoder->finish() : decoder->push(z, {real});
    synchronize(device);
    decode_seconds += seconds_since(t0);
    if (out.defined()) frames += out.size(0);
  };
  std::vector<double> next_seconds;
  // Per iteration, the decode of what it made: a live loop's frame rate is a block's generation and its decode.
  std::vector<double> decode_next_seconds;
  while (!gen_finished()) {
    const bool profiling = int64_t(next_seconds.size()) == a.profile_iteration;
    if (profiling) start_profiler(device);
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    std::vector<latent::GeneratedFrame> made = gen_next();
    synchronize(device);
    if (profiling) stop_profiler(a.profile_out);
    next_seconds.push_back(seconds_since(t0));
    gen_seconds += next_seconds.back();
    gen_cpu_seconds += cpu_seconds() - c0;
    if (latents == 0 && !made.empty()) first_latent = seconds_since(start);
    state_max = std::max(state_max, gen_state());
    const double decoded_before = decode_seconds;
    for (const latent::GeneratedFrame& f : made) {
      if (decoder) decode(f.latent.squeeze(2), f.index == 0 ? 1 : tf);
      if (!a.save_latents.empty()) kept.push_back(f.latent.to(torch::kCPU));
      if (++latents % a.sample == 0)
        samples.push_back(Value(latent::json::Object{{"latents", Value::integer(latents)},
                                                     {"rss_bytes", Value::integer(proc_status_bytes("VmRSS"))}}));
    }
    decode_next_seconds.push_back(decode_seconds - decoded_before);
  }
  if (decoder) decode({}, -1);
  const double wall = seconds_since(start);
  const int64_t rss_peak = proc_status_bytes("VmHWM");
  const int64_t expected_frames = vae ? 1 + tf * (a.latents - 1) : 0;
  if (!kept.empty()) {
    latent::SafetensorsWriter w(a.save_latents, {.durable = false});
    w.write("latents", torch::cat(kept, 2).contiguous());
    w.commit();
  }
  // A clip's model calls come step by step, cond then uncond under guidance: a step's time is its calls' sum.
  std::vector<double> step_seconds;
  const std::vector<double>& calls = timed->call_seconds();
  const int64_t steps = options.sampler.steps;
  if (options.schedule == latent::ScheduleKind::clip && steps > 0 && int64_t(calls.size()) % steps == 0) {
    const size_t per = calls.size() / size_t(steps);
    for (size_t i = 0; i < calls.size(); i += per)
      step_seconds.push_back(std::accumulate(calls.begin() + long(i), calls.begin() + long(i + per), 0.0));
  }

  const latent::GeneratorOptions& o = options;
  latent::json::Object out{
      {"impl", "gst-latent"},
      {"generator", a.generator},
      {"vae", a.vae},
      {"schedule", latent::schedule_kind_name(o.schedule)},
      {"sampler", latent::sampler_kind_name(o.sampler.kind)},
      {"steps", Value::integer(o.sampler.steps)},
      {"window", Value::integer(o.window)},
      {"context", Value::integer(o.context)},
      {"height", Value::integer(o.height)},
      {"width", Value::integer(o.width)},
      {"device", device.str()},
      {"dtype", c10::toString(model->dtype())},
      {"threads", Value::integer(torch::get_num_threads())},
      {"runtime", latent::runtime_summary()},
      {"load_seconds", Value::real(load_seconds)},
      {"latents", Value::integer(latents)},
      {"frames", Value::integer(frames)},
      {"frames_expected", Value::integer(expected_frames)},
      {"model_calls", Value::integer(gen_calls())},
      {"ranks", Value::integer(int64_t(std::max<size_t>(1, ranks.size())))},
      {"devices", a.devices},
      {"plan", plan ? latent::describe_plan(*plan) : std::string()},
      {"plan_cfg", Value::integer(plan ? plan->cfg : 1)},
      {"plan_ulysses", Value::integer(plan ? plan->ulysses : 1)},
      {"plan_partitions", Value::integer(plan ? plan->partitions : 1)},
      {"channels", Value::integer(model->spec().channels)},
      {"temporal_factor", Value::integer(tf)},
      {"attention_heads", Value::integer(timed->inner()->attention_heads())},
      {"iterations", Value::integer(int64_t(next_seconds.size()))},
      {"next_seconds", Value(reals(next_seconds))},
      {"decode_next_seconds", Value(reals(decode_next_seconds))},
      {"guidance", Value::real(o.guidance)},
      {"chunk_frames", Value::integer(o.causal.chunk_frames)},
      {"kv_window", Value::integer(o.causal.kv_window)},
      {"sink_frames", Value::integer(o.causal.sink_frames)},
      {"denoising_steps", Value(integers(o.causal.denoising_steps))},
      {"text", a.text},
      {"latents_file", a.save_latents},
      {"generate_seconds", Value::real(gen_seconds)},
      {"generate_cpu_seconds", Value::real(gen_cpu_seconds)},
      {"model_call_seconds", Value(reals(calls))},
      {"step_seconds", Value(reals(step_seconds))},
      {"decode_seconds", Value::real(decode_seconds)},
      {"wall_seconds", Value::real(wall)},
      {"latents_per_second", Value::real(double(latents) / gen_seconds)},
      {"frames_per_second", Value::real(vae ? double(frames) / wall : 0.0)},
      {"first_latent_seconds", Value::real(first_latent)},
      {"state_bytes", Value::integer(int64_t(state_max))},
      {"rss_baseline_bytes", Value::integer(rss_baseline)},
      {"rss_peak_bytes", Value::integer(rss_peak)},
      {"rss_peak_loading_bytes", Value::integer(rss_peak_loading)},
      {"rss_peak_above_baseline_bytes", Value::integer(rss_peak - rss_baseline)},
      {"rss_peak_reset", hwm_reset},
      {"rss_samples", Value(std::move(samples))},
  };
  if (a.json) {
    std::printf("%s\n", latent::json::dump(Value(std::move(out))).c_str());
  } else {
    const double mib = 1024.0 * 1024.0;
    std::printf("%lld latents (%s, %lld steps, %lld model calls) in %.2f s: %.2f latents/s, first after %.2f s\n",
                (long long)latents, latent::schedule_kind_name(o.schedule),
                (long long)(o.schedule == latent::ScheduleKind::causal ? int64_t(o.causal.denoising_steps.size())
                                                                       : o.sampler.steps),
                (long long)gen_calls(), gen_seconds, double(latents) / gen_seconds, first_latent);
    if (vae)
      std::printf("%lld frames decoded in %.2f s: %.2f frames/s end to end\n", (long long)frames, decode_seconds,
                  double(frames) / wall);
    std::printf("RSS baseline %.1f MiB, peak +%.1f MiB; generator state %.3f MiB\n", double(rss_baseline) / mib,
                double(rss_peak - rss_baseline) / mib, double(state_max) / mib);
  }
  if (vae && frames != expected_frames) {
    std::fprintf(stderr, "latent-gen-bench: %lld frames, expected %lld\n", (long long)frames,
                 (long long)expected_frames);
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
    std::fprintf(stderr, "latent-gen-bench: %s\n", e.what());
    return 1;
  }
}

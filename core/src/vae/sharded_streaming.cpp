#include "latent/vae/sharded_streaming.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <stdexcept>

#include "latent/parallel/row_shard.h"
#include "parallel/rank_threads.h"
#include "vae/tiling.h"

namespace latent {
namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// The bands, in rank order, joined along the rows on the first rank's device.
torch::Tensor join_bands(std::vector<torch::Tensor>& bands, const torch::Device& device) {
  if (!bands[0].defined()) return {};
  for (auto& b : bands) b = b.to(device);
  return torch::cat(bands, bands[0].dim() - 2);
}

template <typename S>
size_t total(const std::vector<std::unique_ptr<S>>& streams, size_t (S::*bytes)() const) {
  size_t n = 0;
  for (const auto& s : streams) n += ((*s).*bytes)();
  return n;
}

// A group that failed has aborted for good: a reset forms a new one (and new streams on it).
template <typename S, typename Remake>
void reset_streams(ShardedRanks& ranks, std::vector<std::unique_ptr<S>>& streams, Remake remake) {
  if (!ranks.broken()) {
    for (auto& s : streams) s->reset();
    return;
  }
  ranks.rebuild();
  remake();
}

}  // namespace

ShardedRanks::ShardedRanks(std::vector<std::shared_ptr<const Vae>> models, parallel::GroupOptions options)
    : models_(std::move(models)), options_(options) {
  if (models_.empty()) throw std::invalid_argument("a sharded stream needs at least one model");
  for (const auto& m : models_) {
    if (!m) throw std::invalid_argument("a sharded stream needs a model for every rank");
    if (m->spec().family != models_[0]->spec().family || m->dtype() != models_[0]->dtype())
      throw std::invalid_argument("the ranks of a sharded stream need the same model in the same dtype");
  }
  threads_ = std::make_unique<parallel::RankThreads>(size());
  rebuild();
}

ShardedRanks::~ShardedRanks() = default;

void ShardedRanks::rebuild() {
  std::vector<torch::Device> devices;
  for (const auto& m : models_) devices.push_back(m->device());
  parallel::ThreadGroup group(devices, options_);
  std::vector<std::shared_ptr<const parallel::RowShard>> shards(models_.size());
  // Every rank joins on its own thread: NCCL's rendezvous needs them all at once. A rank that fails on the way
  // aborts the group, or the others would wait in it for that rank until the timeout.
  threads_->run([&](int r) { shards[size_t(r)] = std::make_shared<parallel::RowShard>(group.join(r)); },
                [&](int r, std::exception_ptr e) {
                  group.abort("rank " + std::to_string(r) + " (" + devices[size_t(r)].str() +
                              ") failed while the group formed: " + what_of(e));
                });
  shards_ = std::move(shards);
  broken_ = false;
}

void ShardedRanks::run(const std::function<void(int)>& job) {
  if (broken_) throw std::logic_error("this sharded stream failed; reset() it before using it again");
  try {
    threads_->run(
        [&](int r) {
          c10::InferenceMode inference;
          c10::DeviceGuard device(models_[size_t(r)]->device());
          job(r);
        },
        [&](int r, std::exception_ptr e) {
          shards_[size_t(r)]->abort("rank " + std::to_string(r) + " (" + models_[size_t(r)]->device().str() +
                                    ") failed: " + what_of(e));
        });
  } catch (...) {
    broken_ = true;
    throw;
  }
}

// ---- encoder ------------------------------------------------------------------------------------------------

ShardedEncoder::ShardedEncoder(std::vector<std::shared_ptr<const Vae>> models, EncoderOptions options,
                               parallel::GroupOptions group)
    : options_(std::move(options)), ranks_(std::move(models), group) {
  if (options_.shard) throw std::invalid_argument("ShardedEncoder makes its own shards; options.shard must be unset");
  make_streams();
}

ShardedEncoder::~ShardedEncoder() = default;

void ShardedEncoder::make_streams() {
  streams_.clear();
  for (int r = 0; r < ranks_.size(); ++r) {
    EncoderOptions o = options_;
    o.shard = ranks_.shard(r);
    streams_.push_back(std::make_unique<StreamingEncoder>(ranks_.model_ptr(r), o));
  }
}

EncodedLatents ShardedEncoder::all_ranks(const std::function<EncodedLatents(StreamingEncoder&)>& step) {
  std::vector<EncodedLatents> out(streams_.size());
  ranks_.run([&](int r) { out[size_t(r)] = step(*streams_[size_t(r)]); });
  std::vector<torch::Tensor> bands;
  for (auto& o : out) bands.push_back(o.latents);
  EncodedLatents whole = std::move(out[0]);
  whole.latents = join_bands(bands, ranks_.model(0).device());
  return whole;
}

EncodedLatents ShardedEncoder::push(const torch::Tensor& frames) {
  return all_ranks([&](StreamingEncoder& s) { return s.push(frames); });
}

EncodedLatents ShardedEncoder::finish() {
  return all_ranks([](StreamingEncoder& s) { return s.finish(); });
}

void ShardedEncoder::reset() {
  reset_streams(ranks_, streams_, [this] { make_streams(); });
}

size_t ShardedEncoder::state_bytes() const { return total(streams_, &StreamingEncoder::state_bytes); }

size_t ShardedEncoder::heap_bytes() const { return total(streams_, &StreamingEncoder::heap_bytes); }

// ---- decoder ------------------------------------------------------------------------------------------------

ShardedDecoder::ShardedDecoder(std::vector<std::shared_ptr<const Vae>> models, DecoderOptions options,
                               parallel::GroupOptions group)
    : options_(std::move(options)), ranks_(std::move(models), group) {
  if (options_.shard) throw std::invalid_argument("ShardedDecoder makes its own shards; options.shard must be unset");
  make_streams();
}

ShardedDecoder::~ShardedDecoder() = default;

void ShardedDecoder::make_streams() {
  streams_.clear();
  for (int r = 0; r < ranks_.size(); ++r) {
    DecoderOptions o = options_;
    o.shard = ranks_.shard(r);
    streams_.push_back(std::make_unique<StreamingDecoder>(ranks_.model_ptr(r), o));
  }
}

torch::Tensor ShardedDecoder::all_ranks(const std::function<torch::Tensor(StreamingDecoder&)>& step) {
  std::vector<torch::Tensor> bands(streams_.size());
  ranks_.run([&](int r) { bands[size_t(r)] = step(*streams_[size_t(r)]); });
  return join_bands(bands, ranks_.model(0).device());
}

torch::Tensor ShardedDecoder::push(const torch::Tensor& latents, const std::vector<int64_t>& real_frames) {
  return all_ranks([&](StreamingDecoder& s) { return s.push(latents, real_frames); });
}

torch::Tensor ShardedDecoder::finish() {
  return all_ranks([](StreamingDecoder& s) { return s.finish(); });
}

void ShardedDecoder::reset() {
  reset_streams(ranks_, streams_, [this] { make_streams(); });
}

size_t ShardedDecoder::state_bytes() const { return total(streams_, &StreamingDecoder::state_bytes); }

size_t ShardedDecoder::heap_bytes() const { return total(streams_, &StreamingDecoder::heap_bytes); }

std::unique_ptr<EncoderStream> open_encoder(const std::vector<std::shared_ptr<const Vae>>& models,
                                            const EncoderOptions& options, parallel::GroupOptions group) {
  if (options.tile.enabled()) {
    if (models.size() != 1) throw std::invalid_argument("spatial tiling and patch parallel cannot be combined");
    return open_tiled_encoder(models[0], options);
  }
  if (models.size() == 1) return std::make_unique<StreamingEncoder>(models[0], options);
  return std::make_unique<ShardedEncoder>(models, options, group);
}

std::unique_ptr<DecoderStream> open_decoder(const std::vector<std::shared_ptr<const Vae>>& models,
                                            const DecoderOptions& options, parallel::GroupOptions group) {
  if (options.tile.enabled()) {
    if (models.size() != 1) throw std::invalid_argument("spatial tiling and patch parallel cannot be combined");
    return open_tiled_decoder(models[0], options);
  }
  if (models.size() == 1) return std::make_unique<StreamingDecoder>(models[0], options);
  return std::make_unique<ShardedDecoder>(models, options, group);
}

}  // namespace latent

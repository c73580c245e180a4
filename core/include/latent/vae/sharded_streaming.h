// One stream across several devices of this process (patch parallel): rank i runs on its own thread with models[i]
// and encodes or decodes band i of every frame's rows (latent/parallel/row_shard.h), exchanging halo rows and
// norm statistics with the others. Whole frames (or latents) go in; the bands come back assembled on the first
// rank's device. The result equals one device's, chunk for chunk, so streaming, chunking and frames in == frames
// out work unchanged.
//
// Processes (torchrun, many machines) use StreamingEncoder/StreamingDecoder directly, with options.shard made from
// parallel::join_tcp().
#pragma once

#include <memory>
#include <vector>

#include "latent/parallel/comm.h"
#include "latent/vae/streaming.h"

namespace latent {

namespace parallel {
class RankThreads;
class RowShard;
}  // namespace parallel

// The ranks of a sharded stream: their threads, their group and their bands. Rebuilt after a failure, since a
// group that has aborted stays aborted.
class ShardedRanks {
 public:
  ShardedRanks(std::vector<std::shared_ptr<const Vae>> models, parallel::GroupOptions options);
  ~ShardedRanks();
  int size() const { return int(models_.size()); }
  const Vae& model(int rank) const { return *models_[size_t(rank)]; }
  std::shared_ptr<const Vae> model_ptr(int rank) const { return models_[size_t(rank)]; }
  const std::shared_ptr<const parallel::RowShard>& shard(int rank) const { return shards_[size_t(rank)]; }
  // Runs job(rank) on every rank and waits. On a failure the group is aborted (releasing ranks that wait for
  // the failed one), marked broken and the root cause rethrown.
  void run(const std::function<void(int)>& job);
  bool broken() const { return broken_; }
  // A fresh group (new communicators) for the same ranks.
  void rebuild();

 private:
  std::vector<std::shared_ptr<const Vae>> models_;
  parallel::GroupOptions options_;
  std::unique_ptr<parallel::RankThreads> threads_;
  std::vector<std::shared_ptr<const parallel::RowShard>> shards_;
  bool broken_ = false;
};

class ShardedEncoder : public EncoderStream {
 public:
  // models[i] runs rank i, on its device; ranks on one device may share a model. options.shard must be unset.
  ShardedEncoder(std::vector<std::shared_ptr<const Vae>> models, EncoderOptions options = {},
                 parallel::GroupOptions group = {});
  ~ShardedEncoder() override;

  EncodedLatents push(const torch::Tensor& frames) override;
  EncodedLatents finish() override;
  void reset() override;
  int64_t frames_in() const override { return streams_[0]->frames_in(); }
  int64_t latents_out() const override { return streams_[0]->latents_out(); }
  int64_t pending_frames() const override { return streams_[0]->pending_frames(); }
  int64_t max_delay_frames() const override { return streams_[0]->max_delay_frames(); }
  size_t state_bytes() const override;
  size_t heap_bytes() const override;
  const Vae& vae() const override { return ranks_.model(0); }
  int ranks() const { return ranks_.size(); }

 private:
  EncodedLatents all_ranks(const std::function<EncodedLatents(StreamingEncoder&)>& step);
  void make_streams();

  EncoderOptions options_;
  ShardedRanks ranks_;
  std::vector<std::unique_ptr<StreamingEncoder>> streams_;
};

class ShardedDecoder : public DecoderStream {
 public:
  ShardedDecoder(std::vector<std::shared_ptr<const Vae>> models, DecoderOptions options = {},
                 parallel::GroupOptions group = {});
  ~ShardedDecoder() override;

  using DecoderStream::push;
  torch::Tensor push(const torch::Tensor& latents, const std::vector<int64_t>& real_frames = {}) override;
  torch::Tensor finish() override;
  void reset() override;
  int64_t latents_in() const override { return streams_[0]->latents_in(); }
  int64_t frames_out() const override { return streams_[0]->frames_out(); }
  int64_t pending_latents() const override { return streams_[0]->pending_latents(); }
  size_t state_bytes() const override;
  size_t heap_bytes() const override;
  const Vae& vae() const override { return ranks_.model(0); }
  int ranks() const { return ranks_.size(); }

 private:
  torch::Tensor all_ranks(const std::function<torch::Tensor(StreamingDecoder&)>& step);
  void make_streams();

  DecoderOptions options_;
  ShardedRanks ranks_;
  std::vector<std::unique_ptr<StreamingDecoder>> streams_;
};

// The stream for `models`: one device's for one model, a sharded one (ranks as threads) for several.
std::unique_ptr<EncoderStream> open_encoder(const std::vector<std::shared_ptr<const Vae>>& models,
                                            const EncoderOptions& options, parallel::GroupOptions group = {});
std::unique_ptr<DecoderStream> open_decoder(const std::vector<std::shared_ptr<const Vae>>& models,
                                            const DecoderOptions& options, parallel::GroupOptions group = {});

}  // namespace latent

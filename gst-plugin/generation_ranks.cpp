// videogen's ranks: one device, threads over devices, or processes under torchrun.
#include "generation_ranks.h"

#include <cstdlib>
#include <stdexcept>

namespace latent::gst {

std::optional<ParallelPlan> parse_plan(const std::string& text) {
  if (text.empty() || text == "auto") return std::nullopt;
  ParallelPlan plan;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    int* field = key == "cfg"          ? &plan.cfg
                 : key == "ulysses"    ? &plan.ulysses
                 : key == "partitions" ? &plan.partitions
                                       : nullptr;
    char* end = nullptr;
    const long v = eq == std::string::npos ? 0 : std::strtol(item.c_str() + eq + 1, &end, 10);
    if (!field || eq == std::string::npos || end == item.c_str() + eq + 1 || *end != '\0' || v < 1 || v > 4096)
      throw std::invalid_argument("parallel '" + text + "': '" + item +
                                  "' is not one of cfg=N, ulysses=N, partitions=N (N >= 1), or auto");
    *field = int(v);
    if (comma == std::string::npos) return plan;
    start = comma + 1;
  }
}

namespace {

// The plan for `n` ranks: the parallel property's, or chosen when it says auto.
ParallelPlan plan_for(int n, const char* ranks_are, const Denoiser& model, const GeneratorOptions& o,
                      const std::string& plan_text) {
  if (auto given = parse_plan(plan_text)) {
    if (given->world() != n)
      throw std::invalid_argument("parallel '" + plan_text + "' needs " + std::to_string(given->world()) + " " +
                                  ranks_are + "; there are " + std::to_string(n));
    return *given;
  }
  return choose_plan(n, model.spec(), o.guidance, model.attention_heads(), o.schedule, o.sampler.steps,
                             o.window);
}

// torchrun (WORLD_SIZE > 1, no devices): this process is one rank of a plan shared by every process, which meet at
// rank 0's store (MASTER_ADDR:MASTER_PORT). Every process makes the same latents; each pipeline pushes them.
std::unique_ptr<Frames> make_process_rank(const std::shared_ptr<const Denoiser>& model, const GeneratorOptions& o,
                                          const std::string& plan_text, const ModelSettings& settings,
                                          std::string& described) {
  const auto env = parallel::LaunchEnv::read();
  const ParallelPlan plan = plan_for(env.world, "processes (WORLD_SIZE)", *model, o, plan_text);
  // A sequence group would need a store of its own served by its first rank, which may be on another machine.
  if (plan.ulysses > 1)
    throw std::invalid_argument(
        "ulysses across processes is not supported; use cfg and partitions between "
        "processes, or devices= (ranks as threads) for ulysses within a machine");
  described = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world) +
              " processes: " + describe_plan(plan);
  // The generator exchanges no halo rows: its group forms the collectives' communicator alone.
  parallel::GroupOptions group = group_options(settings);
  group.halo_exchange = false;
  parallel::RankComms comms =
      parallel::join_tcp(env.host, env.port, env.rank, env.world, model->device(), group);
  auto rank = make_rank_generator(model, o, plan, comms.collectives);
  return std::make_unique<Frames>(std::move(rank), std::move(comms));
}

}  // namespace

std::unique_ptr<Frames> make_frames(const std::vector<std::shared_ptr<const Denoiser>>& ranks,
                                    const GeneratorOptions& o, const std::string& plan_text,
                                    const ModelSettings& model, std::string& described) {
  described.clear();
  if (ranks.size() <= 1) {
    if (parallel::LaunchEnv::present() && parallel::LaunchEnv::read().world > 1)
      return make_process_rank(ranks.front(), o, plan_text, model, described);
    if (!plan_text.empty() && plan_text != "auto")
      throw std::invalid_argument("parallel '" + plan_text + "' needs devices (one per rank)");
    return std::make_unique<Frames>(std::make_unique<Generator>(ranks.front(), o));
  }
  const int n = int(ranks.size());
  const ParallelPlan plan = plan_for(n, "devices", *ranks.front(), o, plan_text);
  described = "generating on " + std::to_string(n) + " devices: " + describe_plan(plan);
  return std::make_unique<Frames>(
      std::make_unique<ParallelGenerator>(ranks, o, plan, group_options(model)));
}

}  // namespace latent::gst

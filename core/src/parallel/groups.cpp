// Forming groups: ranks as threads over an in-memory store, ranks as processes over a TCPStore.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "io/numbers.h"
#include "latent/parallel/comm.h"
#include "parallel/local_group.h"
#include "parallel/nccl_comm.h"
#include "parallel/store_comm.h"

namespace latent::parallel {
namespace {

using Clock = std::chrono::steady_clock;

bool use_nccl(Backend backend, const torch::Device& device) {
  if (backend == Backend::store) return false;
  if (backend == Backend::nccl) {
    if (!device.is_cuda()) throw std::invalid_argument("the NCCL backend needs CUDA devices; got " + device.str());
    return true;
  }
  return device.is_cuda();
}

bool& store_formation_waits() {
  static bool waits = false;
  return waits;
}

// `enlist` sees each communicator before it forms, so that an abort from another thread reaches it while it waits.
RankComms make_comms(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world, const torch::Device& device,
                     const GroupOptions& options, bool nccl, const Enlist& enlist = {}) {
  auto make = [&](const std::string& name) -> std::shared_ptr<Communicator> {
    if (nccl) return make_nccl_communicator(store, name, rank, world, device, options.timeout, enlist);
    auto c = std::make_shared<StoreCommunicator>(store, name, rank, world, options.timeout);
    if (enlist) enlist(c);
    if (store_formation_waits())
      wait_for_all(*store, "latent/" + name + "/formed", rank, world, options.timeout,
                   "formed the " + name + " communicator");
    return c;
  };
  RankComms comms;
  if (options.halo_exchange) comms.halo = make("halo");
  comms.collectives = make("collectives");
  return comms;
}

// Every rank counts itself in, then waits for the count to reach the world size.
void rendezvous(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout) {
  wait_for_all(store, "latent/joined", rank, world, timeout, "joined");
}

// Rank 0 serves the store: leaving before the others are done with it would cut them off mid-call. So every
// rank says when it leaves, and rank 0 waits (up to the timeout) for all of them.
struct Departure {
  Departure(c10::intrusive_ptr<c10d::Store> s, int r, int w, std::chrono::milliseconds t)
      : store(std::move(s)), rank(r), world(w), timeout(t) {}
  // One per rank: a copy would leave twice.
  Departure(const Departure&) = delete;
  Departure& operator=(const Departure&) = delete;
  c10::intrusive_ptr<c10d::Store> store;
  int rank, world;
  std::chrono::milliseconds timeout;
  ~Departure() {
    try {
      store->add("latent/left", 1);
      if (rank != 0) return;
      const auto deadline = Clock::now() + timeout;
      while (store->add("latent/left", 0) < world && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "latent: rank %d leaving the group: %s\n", rank, e.what());
    }
  }
};

// The communicators keep `departure` alive: it runs when this rank's last one goes.
RankComms with_departure(RankComms comms, std::shared_ptr<Departure> departure) {
  auto hold = [&](std::shared_ptr<Communicator> c) -> std::shared_ptr<Communicator> {
    if (!c) return nullptr;
    Communicator* raw = c.get();
    return std::shared_ptr<Communicator>(raw, [c, departure](Communicator*) mutable {
      c.reset();
      departure.reset();
    });
  };
  return {hold(comms.halo), hold(comms.collectives)};
}

// A thread rank's communicator: see local_member().
class LocalMember : public Communicator {
 public:
  LocalMember(std::shared_ptr<Communicator> backend, std::shared_ptr<LocalGroup> group)
      : backend_(std::move(backend)), group_(std::move(group)) {}
  int rank() const override { return backend_->rank(); }
  int size() const override { return backend_->size(); }
  const char* backend_name() const override { return backend_->backend_name(); }
  void all_reduce_sum(torch::Tensor& t) override {
    guarded([&] { backend_->all_reduce_sum(t); });
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    return guarded([&] { return backend_->all_gather(t); });
  }
  torch::Tensor all_to_all(const torch::Tensor& input) override {
    return guarded([&] { return backend_->all_to_all(input); });
  }
  void exchange(const torch::Tensor& to_prev, const torch::Tensor& to_next, torch::Tensor& from_prev,
                torch::Tensor& from_next) override {
    guarded([&] { backend_->exchange(to_prev, to_next, from_prev, from_next); });
  }
  void abort(const std::string& why) noexcept override { group_->abort(why); }

 private:
  // A backend freed by an abort throws what it throws (NCCL: "communicator was aborted"); the caller must see the
  // failed rank's cause instead, marked as a report of it, so the root cause is told apart from its echoes.
  template <typename Call>
  auto guarded(Call&& call) -> decltype(call()) {
    if (group_->aborted()) group_->rethrow();
    try {
      return call();
    } catch (...) {
      if (group_->aborted()) group_->rethrow();
      throw;
    }
  }

  std::shared_ptr<Communicator> backend_;
  std::shared_ptr<LocalGroup> group_;
};

testing::CommunicatorHook& communicator_hook() {
  static testing::CommunicatorHook hook;
  return hook;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw std::invalid_argument(std::string(name) + " is not set (launch with torchrun)");
  const auto n = bounded_integer(v, lo, hi);
  if (!n)
    throw std::invalid_argument(std::string(name) + "=" + v + " is not a whole number from " + std::to_string(lo) +
                                " to " + std::to_string(hi));
  return int(*n);
}

}  // namespace

void LocalGroup::enlist(const std::shared_ptr<Communicator>& c) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    members_.push_back(c);
    if (!aborted_.load(std::memory_order_relaxed)) return;
    why = why_;
  }
  // Made after the abort: it would otherwise wait for ranks that have given up.
  c->abort(why);
}

void LocalGroup::abort(const std::string& why) noexcept {
  std::vector<std::shared_ptr<Communicator>> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    why_ = why.empty() ? "a rank aborted the group" : why;
    aborted_.store(true, std::memory_order_release);
    for (const auto& m : members_)
      if (auto c = m.lock()) live.push_back(std::move(c));
  }
  // Outside the lock: an NCCL abort takes a while, and the members' own threads look at aborted() meanwhile.
  for (const auto& c : live) c->abort(why_);
}

void LocalGroup::rethrow() const {
  std::lock_guard<std::mutex> lock(mutex_);
  throw ParallelError(ParallelError::Kind::peer_failed, why_);
}

std::shared_ptr<Communicator> local_member(std::shared_ptr<Communicator> backend, std::shared_ptr<LocalGroup> group) {
  group->enlist(backend);
  return std::make_shared<LocalMember>(std::move(backend), std::move(group));
}

struct ThreadGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  bool nccl = false;
  std::shared_ptr<LocalGroup> local = std::make_shared<LocalGroup>();
};

ThreadGroup::ThreadGroup(std::vector<torch::Device> devices, GroupOptions options)
    : devices_(std::move(devices)), options_(options), impl_(std::make_shared<Impl>()) {
  if (devices_.empty()) throw std::invalid_argument("a group needs at least one device");
  impl_->store = c10::make_intrusive<c10d::HashStore>();
  impl_->store->setTimeout(options_.timeout);
  // NCCL refuses two ranks on one GPU: such groups take the store backend unless NCCL was asked for by name.
  std::set<std::string> distinct;
  bool all_cuda = true;
  for (const auto& d : devices_) {
    distinct.insert(d.str());
    all_cuda = all_cuda && d.is_cuda();
  }
  if (options_.backend == Backend::nccl) {
    for (const auto& d : devices_) use_nccl(Backend::nccl, d);
    if (distinct.size() != devices_.size())
      throw std::invalid_argument("the NCCL backend needs a GPU per rank; devices repeat");
    impl_->nccl = true;
  } else {
    impl_->nccl =
        options_.backend == Backend::automatic && all_cuda && distinct.size() == devices_.size() && devices_.size() > 1;
  }
  // Read once, on the caller's thread, before the ranks' threads form their groups (any note comes once).
  if (impl_->nccl) keep_process_on_nccl_errors();
}

ThreadGroup::~ThreadGroup() = default;

RankComms ThreadGroup::join(int rank) {
  if (rank < 0 || rank >= size()) throw std::out_of_range("rank " + std::to_string(rank) + " outside the group");
  const torch::Device& device = devices_[size_t(rank)];
  try {
    if (impl_->local->aborted()) impl_->local->rethrow();
    const std::shared_ptr<LocalGroup> local = impl_->local;
    RankComms comms = make_comms(impl_->store, rank, size(), device, options_, impl_->nccl,
                                 [local](const std::shared_ptr<Communicator>& c) { local->enlist(c); });
    if (const auto& hook = communicator_hook()) {
      if (comms.halo) comms.halo = hook(comms.halo, "halo");
      comms.collectives = hook(comms.collectives, "collectives");
    }
    RankComms out;
    if (comms.halo) out.halo = local_member(comms.halo, impl_->local);
    out.collectives = local_member(comms.collectives, impl_->local);
    return out;
  } catch (const ParallelError& e) {
    // A report of another rank's failure: that rank has told the group already.
    if (e.kind() != ParallelError::Kind::peer_failed)
      abort("rank " + std::to_string(rank) + " (" + device.str() + ") failed to join: " + e.what());
    throw;
  } catch (const std::exception& e) {
    abort("rank " + std::to_string(rank) + " (" + device.str() + ") failed to join: " + e.what());
    throw;
  }
}

void ThreadGroup::abort(const std::string& why) noexcept {
  std::string first = why.empty() ? "a rank aborted the group" : why;
  try {
    // The store's key is what a rank waiting to form looks at; the first abort's cause stays there.
    const std::vector<uint8_t> stored =
        impl_->store->compareSet(kAbortKey, std::vector<uint8_t>{}, std::vector<uint8_t>(first.begin(), first.end()));
    if (!stored.empty()) first.assign(stored.begin(), stored.end());
  } catch (...) {
    // An in-memory store does not fail; the local abort below reaches the formed ranks regardless.
  }
  impl_->local->abort(first);
}

RankComms join_tcp(const std::string& host, int port, int rank, int world, const torch::Device& device,
                   GroupOptions options) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside a world of " + std::to_string(world));
  if (port <= 0 || port > 65535) throw std::invalid_argument("port " + std::to_string(port) + " out of range");
  c10d::TCPStoreOptions o;
  o.port = uint16_t(port);
  o.isServer = rank == 0;
  o.numWorkers = size_t(world);
  o.waitWorkers = false;  // the rendezvous below waits, with a message of ours
  o.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const c10::Error& e) {
    throw ParallelError(rank == 0 ? ParallelError::Kind::backend : ParallelError::Kind::timeout,
                        "rank " + std::to_string(rank) + ": " + (rank == 0 ? "cannot serve" : "cannot reach") +
                            " the rendezvous store at " + host + ":" + std::to_string(port) + ": " +
                            e.what_without_backtrace());
  }
  rendezvous(*store, rank, world, options.timeout);
  return with_departure(make_comms(store, rank, world, device, options, use_nccl(options.backend, device) && world > 1),
                        std::make_shared<Departure>(store, rank, world, options.timeout));
}

void testing::set_communicator_hook(CommunicatorHook hook) { communicator_hook() = std::move(hook); }

void testing::set_store_formation_waits(bool on) { store_formation_waits() = on; }

bool LaunchEnv::present() {
  const char* w = std::getenv("WORLD_SIZE");
  return w && *w;
}

LaunchEnv LaunchEnv::read() {
  LaunchEnv e;
  e.world = env_int("WORLD_SIZE", 1, 1 << 16);
  e.rank = env_int("RANK", 0, e.world - 1);
  const char* local = std::getenv("LOCAL_RANK");
  e.local_rank = local && *local ? env_int("LOCAL_RANK", 0, 1 << 16) : e.rank;
  const char* host = std::getenv("MASTER_ADDR");
  e.host = host && *host ? host : "127.0.0.1";
  e.port = env_int("MASTER_PORT", 1, 65535);
  return e;
}

}  // namespace latent::parallel

// Ranks that are threads of one process (ThreadGroup) share more than a store: each can reach every rank's
// communicators directly. A rank that fails aborts them all at once, so a peer blocked in a collective for it is
// freed by its own communicator's abort (for NCCL, ncclCommAbort ends the kernel that waits), not by a store key
// that only a polling wait would see, nor by c10d's watchdog after the timeout.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "latent/parallel/comm.h"

namespace latent::parallel {

class LocalGroup {
 public:
  // Enlists one rank's communicator: abort() reaches it (at once, where the group is aborted already). The group
  // does not keep it alive.
  void enlist(const std::shared_ptr<Communicator>& c);
  // The first call wins: its `why` is what every rank reports. Aborts every enlisted communicator that lives.
  void abort(const std::string& why) noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The first abort's cause, as a ParallelError(peer_failed).
  [[noreturn]] void rethrow() const;

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> aborted_{false};
  std::string why_;
  std::vector<std::weak_ptr<Communicator>> members_;
};

// A thread rank's communicator, around the backend's: it looks at the group before each call, aborts the whole
// group when told to, and reports a call that failed because another rank aborted the group as that rank's
// failure (ParallelError peer_failed with its cause), whatever the backend threw.
std::shared_ptr<Communicator> local_member(std::shared_ptr<Communicator> backend, std::shared_ptr<LocalGroup> group);

}  // namespace latent::parallel

namespace latent::parallel::testing {

// Lets a test stand between a thread group and its communicators: to fail a rank on its Nth call, or to put in a
// backend that blocks as an NCCL kernel does. Thread groups joined while a hook is set pass it every communicator
// they made (`name`: "halo" or "collectives") and use what it returns. Not for concurrent use with other groups.
using CommunicatorHook =
    std::function<std::shared_ptr<Communicator>(std::shared_ptr<Communicator> made, const std::string& name)>;
void set_communicator_hook(CommunicatorHook hook);  // an empty hook removes it

// Makes the store backend form its communicators as NCCL does: each waits in join() until every rank of the group
// has joined, so a test can show what a rank that fails while the others form does to them. Off by default, where
// join() returns at once and one thread may join every rank in turn.
void set_store_formation_waits(bool on);

}  // namespace latent::parallel::testing

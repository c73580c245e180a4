// Deadlines for calls that the caller does not wait for. An NCCL collective returns once it is queued on the CUDA
// stream; the host never waits for it, so no wait of the caller's can see it run past its deadline. A thread of the
// group's own looks instead: it drops each call that has finished, and when one is still unfinished at its deadline
// (or the probe reports the group broken elsewhere) it fires once, and the owner aborts the group. The caller learns
// of it at its next call (check()), or sooner where the abort frees a wait it is in.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "latent/parallel/comm.h"

namespace latent::parallel {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Fired {
    ParallelError::Kind kind;
    std::string why;
  };
  // `fire` runs once, on the watchdog's thread, with the first reason found. `probe`, where set, runs every `tick`
  // while calls are in flight (a look at the store for another rank's abort, say) and reports a reason to fire.
  Watchdog(std::function<void(const Fired&)> fire, std::chrono::milliseconds tick,
           std::function<std::optional<Fired>()> probe = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches one call until done() says it has finished; if `deadline` comes first, fires a timeout that says
  // `late`. done() runs on the watchdog's thread and must not block. Ignored once fired.
  void watch(std::function<bool()> done, Clock::time_point deadline, std::string late);
  // Throws the ParallelError it fired with, if it has.
  void check() const;
  bool fired() const;
  // Calls watched and not yet seen finished.
  size_t in_flight() const;

 private:
  void loop();
  // Under the lock: drops finished calls, and returns why to fire, if a deadline has passed.
  std::optional<Fired> sweep(Clock::time_point now);

  struct Call {
    std::function<bool()> done;
    Clock::time_point deadline;
    std::string late;
  };

  std::function<void(const Fired&)> fire_;
  std::function<std::optional<Fired>()> probe_;
  std::chrono::milliseconds tick_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Call> calls_;
  std::optional<Fired> fired_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace latent::parallel

#include "parallel/watchdog.h"

#include <algorithm>

namespace latent::parallel {

Watchdog::Watchdog(std::function<void(const Fired&)> fire, std::chrono::milliseconds tick,
                   std::function<std::optional<Fired>()> probe)
    : fire_(std::move(fire)), probe_(std::move(probe)), tick_(tick) {
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::function<bool()> done, Clock::time_point deadline, std::string late) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) return;
  calls_.push_back({std::move(done), deadline, std::move(late)});
}

void Watchdog::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) throw ParallelError(fired_->kind, fired_->why);
}

bool Watchdog::fired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fired_.has_value();
}

size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

std::optional<Watchdog::Fired> Watchdog::sweep(Clock::time_point now) {
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(), [](const Call& c) { return c.done(); }), calls_.end());
  for (const Call& c : calls_)
    if (now >= c.deadline) return Fired{ParallelError::Kind::timeout, c.late};
  return std::nullopt;
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, tick_, [&] { return stop_; });
    if (stop_ || fired_ || calls_.empty()) continue;
    std::optional<Fired> why = sweep(Clock::now());
    if (!why && probe_ && !calls_.empty()) {
      // Outside the lock: a probe may be a round trip to another machine's store, and watch() must not wait on it.
      lock.unlock();
      why = probe_();
      lock.lock();
    }
    if (!why || fired_) continue;
    fired_ = why;
    calls_.clear();
    lock.unlock();
    fire_(*why);
    lock.lock();
  }
}

}  // namespace latent::parallel

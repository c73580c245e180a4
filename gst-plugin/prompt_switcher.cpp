#include "prompt_switcher.h"

#include <exception>

namespace latent::gst {

PromptSwitcher::PromptSwitcher(Deliver deliver, Fail fail)
    : deliver_(std::move(deliver)), fail_(std::move(fail)), worker_([this] { run(); }) {}

PromptSwitcher::~PromptSwitcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    waiting_.reset();
  }
  cv_.notify_all();
  worker_.join();
}

void PromptSwitcher::submit(const std::string& label, Encode encode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_ = Job{label, std::move(encode)};
  }
  cv_.notify_all();
}

void PromptSwitcher::cancel() {
  std::unique_lock<std::mutex> lock(mu_);
  waiting_.reset();
  ++generation_;
  cv_.wait(lock, [&] { return !busy_; });
}

void PromptSwitcher::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || waiting_; });
    if (quit_) return;
    Job job = std::move(*waiting_);
    waiting_.reset();
    busy_ = true;
    const uint64_t generation = generation_;
    lock.unlock();
    torch::Tensor embeddings;
    std::string error;
    try {
      embeddings = job.encode();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an exception of unknown type";
    }
    lock.lock();
    // Delivered under the lock, so a cancel() that returned never sees a late delivery.
    if (generation == generation_ && !quit_) {
      if (error.empty())
        deliver_(embeddings, job.label);
      else
        fail_(job.label, error);
    }
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace latent::gst

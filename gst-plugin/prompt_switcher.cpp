#include "prompt_switcher.h"

#include <exception>

namespace latent::gst {

PromptSwitcher::PromptSwitcher(Deliver deliver, Fail fail) : deliver_(std::move(deliver)), fail_(std::move(fail)) {}

PromptSwitcher::~PromptSwitcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    waiting_.reset();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

bool PromptSwitcher::submit(const std::string& label, Encode encode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return false;
    waiting_ = Job{label, std::move(encode)};
    // The worker starts with the first prompt set while playing: an element that never switches (gst-inspect
    // among them) holds no thread.
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
  return true;
}

void PromptSwitcher::cancel() {
  std::unique_lock<std::mutex> lock(mu_);
  waiting_.reset();
  ++generation_;
  // From a delivery's own callback (an application stopping the pipeline from its bus handler) there is nothing
  // to wait for: the delivery in progress is the caller's.
  if (std::this_thread::get_id() == worker_.get_id()) return;
  cv_.wait(lock, [&] { return !delivering_; });
}

void PromptSwitcher::open() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = true;
}

void PromptSwitcher::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  cancel();
}

void PromptSwitcher::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || waiting_; });
    if (quit_) return;
    Job job = std::move(*waiting_);
    waiting_.reset();
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
    // Delivered outside the lock, so that a callback may set another prompt or stop the element (an application
    // answering the warning from a sync bus handler); delivering_ stays set meanwhile, so a cancel() that returned
    // never sees a late delivery.
    if (generation == generation_ && !quit_) {
      delivering_ = true;
      lock.unlock();
      if (error.empty())
        deliver_(embeddings, job.label);
      else
        fail_(job.label, error);
      lock.lock();
      delivering_ = false;
      cv_.notify_all();
    }
  }
}

}  // namespace latent::gst

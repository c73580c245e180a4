// Prompts set while a causal run plays: encoding one runs the text encoder (seconds for umT5-XXL), which must not
// stall the streaming thread, so a worker thread encodes and hands the embeddings to the run, whose next block
// start takes them. A prompt set while another is being encoded replaces any that waits: only the latest matters.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace latent::gst {

class PromptSwitcher {
 public:
  // Makes the embeddings (on the worker); throws to report an error.
  using Encode = std::function<torch::Tensor()>;
  using Deliver = std::function<void(const torch::Tensor& embeddings, const std::string& label)>;
  using Fail = std::function<void(const std::string& label, const std::string& error)>;

  PromptSwitcher(Deliver deliver, Fail fail);
  ~PromptSwitcher();
  PromptSwitcher(const PromptSwitcher&) = delete;
  PromptSwitcher& operator=(const PromptSwitcher&) = delete;

  // Queues a prompt to encode; false (and dropped) while closed.
  bool submit(const std::string& label, Encode encode);
  // Drops what waits and the result of an encoding in progress, without waiting for that encoding (a text encoder
  // takes seconds, a file may be slow): it ends on the worker and goes nowhere. Waits for a delivery in progress
  // only, so none reaches the caller's stream once this returns.
  void cancel();
  // A stream's start and stop: prompts are taken between open() and close(); close() refuses new ones first and
  // then cancels, so prompts set continually while a pipeline stops cannot keep it waiting.
  void open();
  void close();

 private:
  struct Job {
    std::string label;
    Encode encode;
  };
  void run();

  Deliver deliver_;
  Fail fail_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> waiting_;
  bool delivering_ = false, quit_ = false, open_ = true;
  uint64_t generation_ = 0;  // cancel() counts up; a result of an older generation is dropped
  std::thread worker_;
};

}  // namespace latent::gst

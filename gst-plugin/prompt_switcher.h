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

// prompt and prompt-embeds are one prompt given two ways. Set while the element streams (a live switch), the one
// set replaces the other: the switch goes to what was set, and a later restart runs it. Set before the stream, both
// stay, and the start refuses them ("not both"): a launch line naming both is a mistake, not an order. Call with
// the element's object lock held, after storing the new value.
inline void keep_one_prompt(bool streaming, bool prompt_was_set, std::optional<std::string>& prompt,
                            std::string& prompt_embeds) {
  if (!streaming) return;
  if (prompt_was_set && prompt) prompt_embeds.clear();
  if (!prompt_was_set && !prompt_embeds.empty()) prompt.reset();
}

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

  void submit(const std::string& label, Encode encode);
  // Drops what waits and waits for an encoding in progress, whose result is then dropped too.
  void cancel();

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
  bool busy_ = false, quit_ = false;
  uint64_t generation_ = 0;  // cancel() counts up; a result of an older generation is dropped
  std::thread worker_;
};

}  // namespace latent::gst

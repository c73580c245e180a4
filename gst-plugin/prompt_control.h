// The prompt of a live element (videogen's causal schedule, videorestyle): the prompt / prompt-embeds / text-device
// properties, the text encoder kept resident for the stream's life, prompts set while playing encoded (or read and
// checked) off the streaming thread and handed to the element, and the tags that mark where a stream switched.
// One component, so the two elements cannot drift apart in what a live switch means.
#pragma once

#include <gst/gst.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "latent/gen/text_encoder.h"
#include "latent/vae/vae.h"
#include "prompt_switcher.h"

namespace latent::gst {

// The tags on a stream where its prompt switched: what the prompt was made from, and (videogen) its number.
constexpr const char* kPromptTag = "latent-prompt";
constexpr const char* kPromptIndexTag = "latent-prompt-index";

class PromptControl {
 public:
  // The prompt as the properties give it.
  struct Choice {
    std::optional<std::string> prompt;  // unset differs from "": an empty prompt is a prompt
    std::string embeds;                 // a prompt-embeds file, or ""
    std::string text_device;            // "" for the default
  };
  // Embeddings made for a prompt set while playing, and the label its tag gives ([1, L, D] float32 on the CPU).
  struct Switched {
    torch::Tensor embeddings;
    std::string label;
  };
  // Hands a switch to the element's stream (on the switcher's thread, outside every lock of this component).
  using Apply = std::function<void(const Switched&)>;

  struct PropertyIds {
    guint prompt, embeds, text_device;
  };

  PromptControl(GstElement* element, PropertyIds ids, Apply apply);
  PromptControl(const PromptControl&) = delete;
  PromptControl& operator=(const PromptControl&) = delete;

  // Installs the three properties; the blurbs of prompt and prompt-embeds are the element's.
  static void install_properties(GObjectClass* klass, PropertyIds ids, const char* prompt_blurb,
                                 const char* embeds_blurb);
  // Registers the two tags (once per process).
  static void register_tags();
  // A tag event for a switch: the label (made valid UTF-8) and, when given, the prompt's number.
  static GstEvent* tag_event(const std::string& label, std::optional<guint> index = std::nullopt);

  // One of the three properties: false for any other id. Set while the element streams (`streaming`), prompt and
  // prompt-embeds each replace the other and the new prompt goes to the stream as a switch; set before, both stay
  // and the start refuses them ("not both").
  bool set_property(guint id, const GValue* value, bool streaming);
  bool get_property(guint id, GValue* value) const;
  Choice choice() const;

  // NULL->READY, once the model is loaded: where its folder's text encoder is found, the model's device and dtype,
  // the shape embeddings must have ([1, tokens, dim]), and whether the element is live: a live element keeps the
  // encoder resident (a switch does not load it again), an element that encodes once frees it after its start.
  // Throws DeviceError for a text-device that does not exist.
  struct Model {
    std::string path;
    LoadOptions options;
    int64_t text_tokens = 0, text_dim = 0;
    bool live = false;
  };
  void attach(Model model);
  // READY->NULL: the encoder is freed (an encoding in progress keeps it until it ends).
  void detach();
  // Where the encoder runs: text-device, or by default the model's device, except live on a GPU whose free memory
  // cannot take the encoder twice over (then the CPU). Its dtype: the model's on the model's device, else that
  // device's default.
  TextEncoder::Options encoder_options() const;

  // Encodes `prompts` on the calling thread (a start) with the folder's text encoder: [1, L, D] each, on the CPU
  // in the encoder's dtype. Throws as TextEncoder does.
  std::vector<torch::Tensor> encode(const std::vector<std::string>& prompts);
  // A prompt-embeds file's prompt_embeds, as float32, checked against the model's shape and for non-finite values:
  // std::invalid_argument naming the file and what is wrong.
  torch::Tensor read_embeds(const std::string& path) const;

  // A stream's start and stop: switches are taken between the two. stop() refuses new switches, drops one in
  // flight (without waiting for its encoder) and returns once a delivery in progress ends.
  void start();
  void stop();
  // The last switch delivered since start(): what a stream started again (a seek, new caps) plays under.
  std::optional<Switched> latest() const;

 private:
  struct Resident;
  void switch_to(const Choice& choice);
  std::shared_ptr<Resident> resident();

  GstElement* element_;
  const PropertyIds ids_;
  Apply apply_;
  mutable std::mutex mu_;
  Choice choice_;
  std::optional<Model> model_;
  std::optional<TextEncoder::Options> encoder_options_;
  std::shared_ptr<Resident> resident_;
  std::optional<Switched> latest_;
  PromptSwitcher switcher_;
};

}  // namespace latent::gst

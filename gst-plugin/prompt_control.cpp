#include "prompt_control.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <stdexcept>

#include "latent/gen/prompts.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/devices.h"

GST_DEBUG_CATEGORY_STATIC(prompt_control_debug);
#define GST_CAT_DEFAULT prompt_control_debug

namespace latent::gst {

namespace fs = std::filesystem;

// The loaded encoder, shared with an encoding in progress on the switcher's thread so that detach() never waits
// for it; one encoding at a time.
struct PromptControl::Resident {
  std::mutex mu;
  std::unique_ptr<TextEncoder> encoder;
  fs::path folder;
  TextEncoder::Options options;

  torch::Tensor encode(const std::string& prompt) {
    std::lock_guard<std::mutex> lock(mu);
    torch::NoGradGuard no_grad;
    if (!encoder) encoder = TextEncoder::load(folder, options);
    torch::Tensor out;
    run_on_side_stream(options.device, [&] { out = encoder->encode(prompt).to(torch::kCPU); });
    return out;
  }
};

namespace {

std::optional<std::string> optional_string(const GValue* value) {
  const gchar* v = g_value_get_string(value);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

std::string string_or_empty(const GValue* value) {
  const gchar* v = g_value_get_string(value);
  return v ? v : "";
}

// The bytes of the encoder's weight files: what it takes on a device in the dtype it is stored in.
size_t encoder_file_bytes(const fs::path& folder) {
  size_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder / "text_encoder", ec))
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  return bytes;
}

}  // namespace

PromptControl::PromptControl(GstElement* element, PropertyIds ids, Apply apply)
    : element_(element),
      ids_(ids),
      apply_(std::move(apply)),
      switcher_(
          [this](const torch::Tensor& embeddings, const std::string& label) {
            Switched s{embeddings, label};
            {
              std::lock_guard<std::mutex> lock(mu_);
              latest_ = s;
            }
            apply_(s);
            GST_INFO_OBJECT(element_, "prompt \"%s\" handed to the stream", label.c_str());
          },
          [this](const std::string& label, const std::string& error) {
            GST_ELEMENT_WARNING(element_, RESOURCE, OPEN_READ,
                                ("Cannot switch to the prompt \"%s\": %s", label.c_str(), error.c_str()),
                                ("the stream goes on under its prompt"));
            GST_INFO_OBJECT(element_, "prompt \"%s\" refused: %s", label.c_str(), error.c_str());
          }) {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    GST_DEBUG_CATEGORY_INIT(prompt_control_debug, "latentprompt", 0, "live prompts of the latent elements");
    g_once_init_leave(&once, 1);
  }
  switcher_.close();
}

void PromptControl::install_properties(GObjectClass* klass, PropertyIds ids, const char* prompt_blurb,
                                       const char* embeds_blurb) {
  const auto playing = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING);
  const auto ready = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(klass, ids.prompt,
                                  g_param_spec_string("prompt", "Prompt", prompt_blurb, nullptr, playing));
  g_object_class_install_property(
      klass, ids.embeds, g_param_spec_string("prompt-embeds", "Prompt embeddings", embeds_blurb, nullptr, playing));
  g_object_class_install_property(
      klass, ids.text_device,
      g_param_spec_string("text-device", "Text encoder device",
                          "Where the prompt is encoded (cpu, cuda, cuda:N); unset: the model's device, except for a "
                          "live stream (schedule=causal, videorestyle) on a GPU whose free memory cannot take the "
                          "encoder twice over, which encodes on the CPU. A live stream keeps the encoder loaded "
                          "there, so a prompt set while playing does not load it again; on the model's GPU it runs "
                          "on a CUDA stream of its own. Read at NULL->READY",
                          nullptr, ready));
}

void PromptControl::register_tags() {
  gst_tag_register(kPromptTag, GST_TAG_FLAG_META, G_TYPE_STRING, "latent prompt",
                   "the prompt the latents from here on are made under (its text, or the embeddings file)", nullptr);
  gst_tag_register(kPromptIndexTag, GST_TAG_FLAG_META, G_TYPE_UINT, "latent prompt index",
                   "the number of the prompt a causal run switched to (0: its first)", nullptr);
}

GstEvent* PromptControl::tag_event(const std::string& label, std::optional<guint> index) {
  // A path or a prompt set from C need not be UTF-8; a tag string must be.
  gchar* valid = g_utf8_make_valid(label.c_str(), gssize(label.size()));
  GstTagList* tags = gst_tag_list_new(kPromptTag, valid, nullptr);
  g_free(valid);
  if (index) gst_tag_list_add(tags, GST_TAG_MERGE_REPLACE, kPromptIndexTag, *index, nullptr);
  gst_tag_list_set_scope(tags, GST_TAG_SCOPE_STREAM);
  return gst_event_new_tag(tags);
}

bool PromptControl::set_property(guint id, const GValue* value, bool streaming) {
  Choice now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == ids_.text_device) {
      choice_.text_device = string_or_empty(value);
      return true;
    }
    if (id == ids_.prompt) {
      choice_.prompt = optional_string(value);
      // One prompt given two ways: a live switch by one replaces the other, so a restart runs what plays.
      if (streaming && choice_.prompt) choice_.embeds.clear();
    } else if (id == ids_.embeds) {
      choice_.embeds = string_or_empty(value);
      if (streaming && !choice_.embeds.empty()) choice_.prompt.reset();
    } else {
      return false;
    }
    now = choice_;
  }
  if (streaming) switch_to(now);
  return true;
}

bool PromptControl::get_property(guint id, GValue* value) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto set = [&](const std::string& v) { g_value_set_string(value, v.empty() ? nullptr : v.c_str()); };
  if (id == ids_.prompt)
    g_value_set_string(value, choice_.prompt ? choice_.prompt->c_str() : nullptr);
  else if (id == ids_.embeds)
    set(choice_.embeds);
  else if (id == ids_.text_device)
    set(choice_.text_device);
  else
    return false;
  return true;
}

PromptControl::Choice PromptControl::choice() const {
  std::lock_guard<std::mutex> lock(mu_);
  return choice_;
}

void PromptControl::attach(Model model) {
  std::lock_guard<std::mutex> lock(mu_);
  TextEncoder::Options o;
  const torch::Device device = model.options.device;
  if (!choice_.text_device.empty()) {
    o.device = resolve_device(choice_.text_device);
  } else {
    o.device = device;
    if (model.live && device.is_cuda()) {
      fs::path folder;
      try {
        folder = text_pipeline_folder(model.path);
      } catch (const std::exception&) {
        // No text encoder: prompts come as embeddings, and a prompt says why at its start.
      }
      const size_t need = folder.empty() ? 0 : encoder_file_bytes(folder), have = available_memory(device);
      if (need > 0 && have > 0 && 2 * need > have) {
        o.device = torch::kCPU;
        GST_INFO_OBJECT(element_, "the text encoder (%zu MiB) stays on the CPU: %s has %zu MiB free", need >> 20,
                        device.str().c_str(), have >> 20);
      }
    }
  }
  o.dtype = o.device == device ? model.options.dtype : resolve_dtype("auto", o.device);
  encoder_options_ = o;
  model_ = std::move(model);
  resident_.reset();
}

void PromptControl::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  resident_.reset();
  model_.reset();
  encoder_options_.reset();
}

TextEncoder::Options PromptControl::encoder_options() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!encoder_options_) throw std::logic_error("no model attached");
  return *encoder_options_;
}

std::shared_ptr<PromptControl::Resident> PromptControl::resident() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!model_ || !encoder_options_) throw std::logic_error("no model attached");
  if (!resident_) {
    resident_ = std::make_shared<Resident>();
    resident_->folder = text_pipeline_folder(model_->path);
    resident_->options = *encoder_options_;
  }
  return resident_;
}

std::vector<torch::Tensor> PromptControl::encode(const std::vector<std::string>& prompts) {
  const std::shared_ptr<Resident> r = resident();
  std::vector<torch::Tensor> out;
  for (const std::string& p : prompts) out.push_back(r->encode(p));
  bool live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = model_ && model_->live;
    // Encoded once for a run that never switches: the weights go before the denoiser needs the memory.
    if (!live && resident_ == r) resident_.reset();
  }
  return out;
}

torch::Tensor PromptControl::read_embeds(const std::string& path) const {
  int64_t tokens = 0, dim = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model_) tokens = model_->text_tokens, dim = model_->text_dim;
  }
  SafetensorsFile file = SafetensorsFile::open(path);
  if (!file.contains("prompt_embeds"))
    throw std::invalid_argument("prompt-embeds file " + path +
                                " has no tensor \"prompt_embeds\" (write it with latent-prompt)");
  torch::Tensor t = file.tensor("prompt_embeds");
  const auto shape = [](const torch::Tensor& x) {
    std::string s = "[";
    for (int64_t i = 0; i < x.dim(); ++i) s += (i ? ", " : "") + std::to_string(x.size(i));
    return s + "]";
  };
  if (!t.is_floating_point())
    throw std::invalid_argument("prompt-embeds file " + path + ": prompt_embeds is not floating point");
  if (t.dim() != 3 || t.size(0) != 1 || (tokens > 0 && t.size(1) != tokens) || (dim > 0 && t.size(2) != dim))
    throw std::invalid_argument("prompt-embeds file " + path + ": prompt_embeds is " + shape(t) +
                                ", the model takes [1, " + (tokens > 0 ? std::to_string(tokens) : "L") + ", " +
                                (dim > 0 ? std::to_string(dim) : "D") + "]");
  torch::Tensor out = t.to(torch::kFloat).clone();
  // One NaN in the embeddings reaches every latent through cross-attention.
  if (!torch::isfinite(out).all().item<bool>())
    throw std::invalid_argument("prompt-embeds file " + path + ": prompt_embeds holds NaN or infinite values");
  return out;
}

void PromptControl::switch_to(const Choice& choice) {
  if (choice.prompt) {
    std::shared_ptr<Resident> r;
    try {
      r = resident();
    } catch (const std::exception& e) {
      GST_ELEMENT_WARNING(element_, RESOURCE, NOT_FOUND, ("Cannot switch the prompt: %s", e.what()), (nullptr));
      GST_INFO_OBJECT(element_, "prompt \"%s\" refused: %s", choice.prompt->c_str(), e.what());
      return;
    }
    const std::string prompt = *choice.prompt;
    switcher_.submit(prompt, [r, prompt] { return r->encode(prompt).to(torch::kFloat); });
  } else if (!choice.embeds.empty()) {
    const std::string path = choice.embeds;
    gchar* shown = g_filename_display_name(path.c_str());
    const std::string label = shown;
    g_free(shown);
    switcher_.submit(label, [this, path] { return read_embeds(path); });
  }
}

void PromptControl::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    latest_.reset();
  }
  switcher_.open();
}

void PromptControl::stop() { switcher_.close(); }

std::optional<PromptControl::Switched> PromptControl::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

}  // namespace latent::gst

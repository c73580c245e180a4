// Waiting for a prompt set while playing to be settled (handed to the stream, or refused) instead of sleeping: the
// live elements say so in their "latentprompt" debug category, and a switch that lands after the stream ended
// would make a test's outcome depend on the machine's load.
// Include after the C++ standard headers and gst/check/gstcheck.h (check's macros rewrite names).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include <gst/gst.h>

namespace latent_test {

class PromptsSettled {
 public:
  PromptsSettled() {
    gst_debug_set_active(TRUE);
    gst_debug_set_threshold_for_name("latentprompt", GST_LEVEL_INFO);
    gst_debug_add_log_function(&PromptsSettled::log, this, nullptr);
  }
  ~PromptsSettled() { gst_debug_remove_log_function_by_data(this); }
  PromptsSettled(const PromptsSettled&) = delete;
  PromptsSettled& operator=(const PromptsSettled&) = delete;

  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return settled_;
  }
  // Waits until `n` switches in all have settled; false after `seconds` without.
  bool wait_for(size_t n, double seconds = 60) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return settled_ >= n; });
  }

 private:
  static void log(GstDebugCategory* category, GstDebugLevel level, const gchar*, const gchar*, gint, GObject*,
                  GstDebugMessage* message, gpointer data) {
    if (level != GST_LEVEL_INFO || std::strcmp(gst_debug_category_get_name(category), "latentprompt") != 0) return;
    const gchar* text = gst_debug_message_get(message);
    if (!text || std::strncmp(text, "prompt \"", 8) != 0) return;
    if (!std::strstr(text, "\" handed to the stream") && !std::strstr(text, "\" refused: ")) return;
    auto* self = static_cast<PromptsSettled*>(data);
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->settled_++;
    }
    self->cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  size_t settled_ = 0;
};

}  // namespace latent_test

// videogen's progress messages.
#include "generation_progress.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

namespace latent::gst {
namespace {

// "1:02:03", "4:05": durations in progress texts.
std::string clock_text(GstClockTime t) {
  const uint64_t secs = (t + GST_SECOND / 2) / GST_SECOND;
  char buf[32];
  if (secs >= 3600)
    std::snprintf(buf, sizeof buf, "%u:%02u:%02u", unsigned(secs / 3600), unsigned(secs / 60 % 60),
                  unsigned(secs % 60));
  else
    std::snprintf(buf, sizeof buf, "%u:%02u", unsigned(secs / 60), unsigned(secs % 60));
  return buf;
}

}  // namespace

std::function<void(const GeneratorProgress&)> progress_poster(GstElement* element) {
  struct Clock {
    std::chrono::steady_clock::time_point start, last;
  };
  auto clock = std::make_shared<Clock>();
  return [element, clock](const GeneratorProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool first = p.iteration <= 1, last = p.iterations > 0 && p.iteration >= p.iterations;
    if (first) clock->start = now;
    // An endless run has no last iteration and no end to wait for: after its first, one message a minute, so that
    // an application that never pops its bus does not collect four a second for as long as the stream runs.
    const auto gap = p.iterations > 0 ? std::chrono::milliseconds(250) : std::chrono::milliseconds(60'000);
    if (!first && !last && now - clock->last < gap) return;
    clock->last = now;
    const auto elapsed = GstClockTime(std::chrono::duration_cast<std::chrono::nanoseconds>(now - clock->start).count());
    // From the rate of the iterations after the first, which carries the warm-up; the clock starts after it.
    GstClockTime eta = GST_CLOCK_TIME_NONE;
    if (last)
      eta = 0;
    else if (p.iterations > 0 && p.iteration > 1)
      eta = gst_util_uint64_scale(elapsed, uint64_t(p.iterations - p.iteration), uint64_t(p.iteration - 1));
    std::string text = "step " + std::to_string(p.iteration);
    if (p.iterations > 0) text += " of " + std::to_string(p.iterations);
    if (GST_CLOCK_TIME_IS_VALID(eta) && !last) text += ", " + clock_text(eta) + " left";
    GstStructure* st = gst_structure_new("videogen-progress", "text", G_TYPE_STRING, text.c_str(), nullptr);
    gst_structure_set(st, "iteration", G_TYPE_INT64, gint64(p.iteration), "iterations", G_TYPE_INT64,
                      gint64(p.iterations), "percent", G_TYPE_INT,
                      p.iterations > 0 ? int(100 * p.iteration / p.iterations) : -1, "elapsed", G_TYPE_UINT64,
                      guint64(elapsed), "eta", G_TYPE_UINT64, guint64(eta), nullptr);
    gst_element_post_message(element, gst_message_new_element(GST_OBJECT(element), st));
  };
}

}  // namespace latent::gst

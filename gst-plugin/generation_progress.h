// videogen's progress messages.
#pragma once

#include <gst/gst.h>

#include <functional>

#include "latent/gen/generator.h"

namespace latent::gst {

// Posts "videogen-progress" element messages as a run goes, so a run of minutes shows it is moving from its first
// step: the first iteration, the last, and at most four a second between; an endless run, its first and then one a
// minute. Fields: text ("step 3 of 50, 1:12
// left"), iteration, iterations (0: endless), percent (-1: endless), and elapsed and eta in nanoseconds (eta
// GST_CLOCK_TIME_NONE where unknown). Element messages, not GST_MESSAGE_PROGRESS: gst-launch-1.0 holds a pipeline in
// PAUSED while a progress operation is open, and the steps before the first latent run during preroll.
std::function<void(const GeneratorProgress&)> progress_poster(GstElement* element);

}  // namespace latent::gst

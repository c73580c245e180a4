// Precompiled for the plugin library: most of its sources reach the LibTorch headers, each of which alone took
// over a minute to compile on the 2-core CI machine. GCC puts it in front of every source (meson's -include).

#include <gst/base/gstbasesink.h>
#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>
#include <gst/video/video.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

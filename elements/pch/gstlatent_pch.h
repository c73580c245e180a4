// Precompiled for the plugin library: most of its sources reach the LibTorch headers, each of which alone took
// over a minute to compile on the 2-core CI machine. GCC puts it in front of every source (meson's -include).
// The tensor API only (torch/types.h: ATen, the factory functions, dtypes; torch/utils.h: NoGradGuard,
// manual_seed), not torch/torch.h: its C++ frontend (nn, optim, data, serialization) is used by no source here, and
// loading it cost every translation unit 6.2 s even precompiled, against 2.8 s for these two (an empty source on
// this machine, GCC 12). Sources include what they use beyond them (torch/cuda.h, torch/serialize.h).

#include <gst/base/gstbasesink.h>
#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>
#include <gst/video/video.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

// What videogen tests share: the latents an appsink received as one tensor, their distance to a reference, and
// string properties set on the element named "gen".
// Include after the C++ standard headers, torch and gst/check/gstcheck.h (check's macros rewrite names).
#pragma once

#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline_run.h"

namespace latent_test {

// The latents that reached the sink, [1, C, T, h, w] float32: one buffer per latent frame, [C, h, w].
inline torch::Tensor stacked(const Out& out, int64_t c, int64_t h, int64_t w) {
  std::vector<torch::Tensor> frames;
  for (GstBuffer* b : out.buffers) {
    GstMapInfo m;
    gst_buffer_map(b, &m, GST_MAP_READ);
    fail_unless_equals_uint64(m.size, uint64_t(c * h * w) * sizeof(float));
    frames.push_back(torch::from_blob(m.data, {c, h, w}, torch::kFloat).clone());
    gst_buffer_unmap(b, &m);
  }
  return torch::stack(frames, 1).unsqueeze(0);
}

inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}

// Sets string properties of the element named "gen" (prompts with runs of spaces and html references pass as they
// are, which a launch line would not); unset values are left alone.
inline std::function<void(GstElement*)> set_strings(
    std::vector<std::pair<const char*, std::optional<std::string>>> kv) {
  return [kv](GstElement* pipeline) {
    GstElement* gen = gst_bin_get_by_name(GST_BIN(pipeline), "gen");
    for (const auto& [k, v] : kv)
      if (v) g_object_set(gen, k, v->c_str(), nullptr);
    gst_object_unref(gen);
  };
}

}  // namespace latent_test

#include "fixed_latents.h"

#include <vector>

namespace latent::gst {

std::string latent_spaces_of(const GstCaps* caps) {
  std::vector<std::string> models;
  for (guint i = 0; i < gst_caps_get_size(caps); ++i) {
    const GstStructure* s = gst_caps_get_structure(caps, i);
    if (!gst_structure_has_name(s, "video/x-latent")) continue;
    const gchar* model = gst_structure_get_string(s, "model");
    if (!model) return "latents of any model";
    const std::string quoted = std::string("'") + model + "'";
    bool seen = false;
    for (const std::string& m : models) seen = seen || m == quoted;
    if (!seen) models.push_back(quoted);
  }
  if (models.empty()) return "no latents";
  std::string out = models[0];
  for (size_t i = 1; i < models.size(); ++i) out += (i + 1 == models.size() ? " or " : ", ") + models[i];
  return out;
}

bool negotiate_fixed_latents(GstBaseSrc* src, const LatentCapsInfo& ours, const std::string& has) {
  GstPad* pad = GST_BASE_SRC_PAD(src);
  GstCaps* caps = ours.to_caps();
  GstCaps* accepted = gst_pad_peer_query_caps(pad, caps);
  const bool fits = !gst_caps_is_empty(accepted);
  gst_caps_unref(accepted);
  if (!fits) {
    GstCaps* wanted = gst_pad_peer_query_caps(pad, nullptr);
    gchar* want = gst_caps_to_string(wanted);
    GST_ELEMENT_ERROR(src, CORE, NEGOTIATION,
                      ("%s latents of model '%s' (%d channels, %dx%d latents for %dx%d video); downstream accepts "
                       "none of them: it takes %s.",
                       has.c_str(), ours.model.c_str(), ours.channels, ours.width, ours.height, ours.video_width,
                       ours.video_height, latent_spaces_of(wanted).c_str()),
                      ("downstream accepts %s", want));
    g_free(want);
    gst_caps_unref(wanted);
    gst_caps_unref(caps);
    return false;
  }
  const gboolean ok = gst_base_src_set_caps(src, caps);
  gst_caps_unref(caps);
  return ok;
}

}  // namespace latent::gst

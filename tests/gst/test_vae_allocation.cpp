// Where vaedecode writes its frames: the buffer pool it settles with downstream through the ALLOCATION query
// (downstream's when offered, else a GstVideoBufferPool of its own), at the pool's strides when downstream reads
// GstVideoMeta, with a new pool for new caps and none left active at READY. Runs on the shipped default model.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <cstring>
#include <string>
#include <vector>

#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>
#include <gst/video/video.h>

namespace {

constexpr const char* kCaps = "video/x-raw,format=RGB,width=64,height=48,framerate=24/1";
constexpr const char* kSmallCaps = "video/x-raw,format=RGB,width=32,height=32,framerate=24/1";

struct Stream {
  GstCaps* caps = nullptr;
  std::vector<GstBuffer*> buffers;
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    for (GstBuffer* b : buffers) gst_buffer_unref(b);
    if (caps) gst_caps_unref(caps);
  }
};

// `frames` pictures of `caps` (RGB) through vaeencode: the latents and their caps.
void encode(const char* caps, int frames, Stream& latents) {
  GstVideoInfo info;
  GstCaps* parsed = gst_caps_from_string(caps);
  fail_unless(gst_video_info_from_caps(&info, parsed));
  gst_caps_unref(parsed);
  GstHarness* h = gst_harness_new("vaeencode");
  gst_harness_set_src_caps_str(h, caps);
  for (int f = 0; f < frames; ++f) {
    GstBuffer* b = gst_harness_create_buffer(h, GST_VIDEO_INFO_SIZE(&info));
    GstMapInfo map;
    fail_unless(gst_buffer_map(b, &map, GST_MAP_WRITE));
    for (gsize i = 0; i < map.size; ++i) map.data[i] = guint8((i * 7 + gsize(f) * 29 + i / 97) & 0xff);
    gst_buffer_unmap(b, &map);
    GST_BUFFER_PTS(b) = gst_util_uint64_scale(f, GST_SECOND, 24);
    GST_BUFFER_DURATION(b) = GST_SECOND / 24;
    fail_unless_equals_int(gst_harness_push(h, b), GST_FLOW_OK);
  }
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  while (GstBuffer* b = gst_harness_try_pull(h)) latents.buffers.push_back(b);
  latents.caps = gst_pad_get_current_caps(h->sinkpad);
  gst_harness_teardown(h);
}

enum class Offer { nothing, pool, padded_pool, failing_pool };

// A downstream element's answer to the ALLOCATION query; every pool it offers is kept (one per query).
struct Downstream {
  Offer offer = Offer::nothing;
  bool video_meta = false;
  std::vector<GstBufferPool*> offered;
  ~Downstream() {
    for (GstBufferPool* p : offered) gst_object_unref(p);
  }
};

// A pool whose start fails, as one whose memory is gone (a device lost, a mapping refused).
struct FailingPool {
  GstVideoBufferPool parent;
};
struct FailingPoolClass {
  GstVideoBufferPoolClass parent_class;
};
G_DEFINE_TYPE(FailingPool, failing_pool, GST_TYPE_VIDEO_BUFFER_POOL)
gboolean refuse_to_start(GstBufferPool*) { return FALSE; }
void failing_pool_class_init(FailingPoolClass* klass) { GST_BUFFER_POOL_CLASS(klass)->start = refuse_to_start; }
void failing_pool_init(FailingPool*) {}

// A GstVideoBufferPool that pads every row by 7 pixels and aligns strides to 16 bytes: frames of 64 RGB pixels
// get 224-byte rows, not 192. The decoder keeps the padding options when it sets its own parameters.
GstBufferPool* padded_pool(GstCaps* caps, guint size) {
  GstBufferPool* pool = gst_video_buffer_pool_new();
  GstStructure* config = gst_buffer_pool_get_config(pool);
  gst_buffer_pool_config_set_params(config, caps, size, 0, 0);
  gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
  gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_ALIGNMENT);
  GstVideoAlignment align;
  gst_video_alignment_reset(&align);
  align.padding_right = 7;
  align.stride_align[0] = 15;
  gst_buffer_pool_config_set_video_alignment(config, &align);
  fail_unless(gst_buffer_pool_set_config(pool, config));
  return pool;
}

GstPadProbeReturn answer_allocation(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* d = static_cast<Downstream*>(data);
  GstQuery* query = GST_PAD_PROBE_INFO_QUERY(info);
  if (GST_QUERY_TYPE(query) != GST_QUERY_ALLOCATION || !(GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_PUSH))
    return GST_PAD_PROBE_OK;
  if (d->offer == Offer::nothing && !d->video_meta) return GST_PAD_PROBE_OK;  // the harness's own answer
  GstCaps* caps = nullptr;
  gboolean need_pool = FALSE;
  gst_query_parse_allocation(query, &caps, &need_pool);
  GstVideoInfo vinfo;
  fail_unless(caps && gst_video_info_from_caps(&vinfo, caps));
  const guint size = guint(GST_VIDEO_INFO_SIZE(&vinfo));
  if (d->video_meta) gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
  GstBufferPool* pool = d->offer == Offer::pool          ? gst_video_buffer_pool_new()
                        : d->offer == Offer::padded_pool ? padded_pool(caps, size)
                        : d->offer == Offer::failing_pool
                            ? GST_BUFFER_POOL(g_object_new(failing_pool_get_type(), nullptr))
                            : nullptr;
  if (pool) {
    gst_object_ref_sink(pool);
    gst_query_add_allocation_pool(query, pool, size, 0, 0);
    d->offered.push_back(pool);
  }
  return GST_PAD_PROBE_HANDLED;
}

struct Decoded : Stream {
  std::vector<std::string> warnings;
};

// `latents` (each stream's caps, then its buffers) through vaedecode, answering its ALLOCATION queries as
// `downstream` says, then EOS. `between` runs on the harness between the streams.
void decode(const std::vector<const Stream*>& latents, Downstream& downstream, Decoded& out,
            void (*between)(GstHarness*, Downstream&) = nullptr) {
  GstHarness* h = gst_harness_new("vaedecode");
  GstPad* src = gst_element_get_static_pad(h->element, "src");
  gst_pad_add_probe(src, GST_PAD_PROBE_TYPE_QUERY_DOWNSTREAM, answer_allocation, &downstream, nullptr);
  gst_object_unref(src);
  GstBus* bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  for (size_t k = 0; k < latents.size(); ++k) {
    if (k > 0 && between) between(h, downstream);
    gst_harness_set_src_caps(h, gst_caps_ref(latents[k]->caps));
    for (GstBuffer* b : latents[k]->buffers)
      fail_unless_equals_int(gst_harness_push(h, gst_buffer_ref(b)), GST_FLOW_OK);
  }
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  while (GstBuffer* b = gst_harness_try_pull(h)) out.buffers.push_back(b);
  out.caps = gst_pad_get_current_caps(h->sinkpad);
  while (GstMessage* m = gst_bus_pop_filtered(bus, GST_MESSAGE_WARNING)) {
    GError* err = nullptr;
    gst_message_parse_warning(m, &err, nullptr);
    out.warnings.push_back(err->message);
    g_clear_error(&err);
    gst_message_unref(m);
  }
  // PAUSED->READY deactivates whatever pool the frames came from.
  fail_unless_equals_int(gst_element_set_state(h->element, GST_STATE_READY), GST_STATE_CHANGE_SUCCESS);
  for (GstBufferPool* p : downstream.offered) fail_if(gst_buffer_pool_is_active(p), "a pool is active at READY");
  for (GstBuffer* b : out.buffers)
    if (b->pool) fail_if(gst_buffer_pool_is_active(b->pool), "the pool of the frames is active at READY");
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
}

// The pixels of a frame in its caps, read where its GstVideoMeta (if any) says rows start.
std::vector<guint8> pixels(GstCaps* caps, GstBuffer* buffer) {
  GstVideoInfo info;
  fail_unless(gst_video_info_from_caps(&info, caps));
  GstVideoFrame frame;
  fail_unless(gst_video_frame_map(&frame, &info, buffer, GST_MAP_READ));
  const gsize row = gsize(GST_VIDEO_FRAME_WIDTH(&frame)) * gsize(GST_VIDEO_FRAME_COMP_PSTRIDE(&frame, 0));
  std::vector<guint8> out;
  for (int y = 0; y < GST_VIDEO_FRAME_HEIGHT(&frame); ++y) {
    const auto* p = static_cast<const guint8*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0)) +
                    gsize(y) * gsize(GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0));
    out.insert(out.end(), p, p + row);
  }
  gst_video_frame_unmap(&frame);
  return out;
}

// Same frames, pixel for pixel, with the same timing.
void expect_same_frames(const Decoded& got, const Decoded& want, const char* what) {
  fail_unless(got.buffers.size() == want.buffers.size(), "%s: %zu frames, expected %zu", what, got.buffers.size(),
              want.buffers.size());
  fail_unless(gst_caps_is_equal(got.caps, want.caps), "%s: other caps", what);
  for (size_t i = 0; i < want.buffers.size(); ++i) {
    fail_unless(pixels(got.caps, got.buffers[i]) == pixels(want.caps, want.buffers[i]), "%s: frame %zu differs", what,
                i);
    fail_unless_equals_uint64(GST_BUFFER_PTS(got.buffers[i]), GST_BUFFER_PTS(want.buffers[i]));
    fail_unless_equals_uint64(GST_BUFFER_DURATION(got.buffers[i]), GST_BUFFER_DURATION(want.buffers[i]));
  }
}

// The frames a downstream that offers nothing gets: the element's own pool, tight rows, 11 frames in, 11 out.
void reference(const Stream& latents, Decoded& out) {
  Downstream nothing;
  decode({&latents}, nothing, out);
  fail_unless_equals_int(out.buffers.size(), 11);
  GstVideoInfo info;
  fail_unless(gst_video_info_from_caps(&info, out.caps));
  guint hash = 0;
  for (size_t i = 0; i < out.buffers.size(); ++i) {
    GstBuffer* b = out.buffers[i];
    fail_unless_equals_uint64(GST_BUFFER_PTS(b), gst_util_uint64_scale(i, GST_SECOND, 24));
    fail_unless_equals_uint64(gst_buffer_get_size(b), GST_VIDEO_INFO_SIZE(&info));
    for (guint8 v : pixels(out.caps, b)) hash = hash * 31 + v;
  }
  // Printed so that the frames can be compared with another build's.
  g_print("reference frames: %zu, pixel hash %08x\n", out.buffers.size(), hash);
}

GST_START_TEST(test_without_an_offer_frames_come_from_a_video_pool_of_its_own) {
  Stream latents;
  encode(kCaps, 11, latents);
  Decoded plain;
  reference(latents, plain);
  GstBufferPool* own = plain.buffers[0]->pool;
  fail_unless(own != nullptr, "frames allocated one by one, not from a pool");
  fail_unless(GST_IS_VIDEO_BUFFER_POOL(own), "the pool is a %s", G_OBJECT_TYPE_NAME(own));
  for (GstBuffer* b : plain.buffers) fail_unless(b->pool == own);
  fail_unless(plain.warnings.empty());
  // Downstream reads GstVideoMeta but has no pool: ours, its frames described.
  Downstream meta_only;
  meta_only.video_meta = true;
  Decoded described;
  decode({&latents}, meta_only, described);
  expect_same_frames(described, plain, "own pool with video meta");
  for (GstBuffer* b : described.buffers) {
    fail_unless(b->pool && GST_IS_VIDEO_BUFFER_POOL(b->pool));
    fail_unless(gst_buffer_get_video_meta(b) != nullptr, "no GstVideoMeta on a frame");
  }
}
GST_END_TEST;

GST_START_TEST(test_frames_come_from_the_pool_downstream_offers) {
  Stream latents;
  encode(kCaps, 11, latents);
  Decoded plain;
  reference(latents, plain);
  Downstream d;
  d.offer = Offer::pool;
  Decoded pooled;
  decode({&latents}, d, pooled);
  fail_unless_equals_int(d.offered.size(), 1);
  for (GstBuffer* b : pooled.buffers) fail_unless(b->pool == d.offered[0], "a frame not from downstream's pool");
  expect_same_frames(pooled, plain, "downstream's pool");
  fail_unless(pooled.warnings.empty());
}
GST_END_TEST;

GST_START_TEST(test_padded_strides_of_downstreams_pool_hold_the_same_pixels) {
  Stream latents;
  encode(kCaps, 11, latents);
  Decoded plain;
  reference(latents, plain);
  Downstream d;
  d.offer = Offer::padded_pool;
  d.video_meta = true;
  Decoded padded;
  decode({&latents}, d, padded);
  fail_unless_equals_int(d.offered.size(), 1);
  for (GstBuffer* b : padded.buffers) {
    fail_unless(b->pool == d.offered[0]);
    GstVideoMeta* meta = gst_buffer_get_video_meta(b);
    fail_unless(meta != nullptr, "no GstVideoMeta on a frame");
    fail_unless(meta->stride[0] > 64 * 3, "stride %d: the pool did not pad", meta->stride[0]);
  }
  expect_same_frames(padded, plain, "padded rows");
}
GST_END_TEST;

GST_START_TEST(test_a_pool_that_cannot_start_falls_back_with_a_warning) {
  Stream latents;
  encode(kCaps, 11, latents);
  Decoded plain;
  reference(latents, plain);
  Downstream d;
  d.offer = Offer::failing_pool;
  Decoded fallen_back;
  decode({&latents}, d, fallen_back);
  fail_unless_equals_int(d.offered.size(), 1);
  fail_unless_equals_int(fallen_back.warnings.size(), 1);
  fail_unless(fallen_back.warnings[0].find("cannot be activated") != std::string::npos, "%s",
              fallen_back.warnings[0].c_str());
  for (GstBuffer* b : fallen_back.buffers)
    fail_unless(b->pool && b->pool != d.offered[0] && GST_IS_VIDEO_BUFFER_POOL(b->pool));
  expect_same_frames(fallen_back, plain, "fallback pool");
}
GST_END_TEST;

GST_START_TEST(test_new_caps_take_a_new_pool_and_the_old_one_is_let_go) {
  Stream big, small;
  encode(kCaps, 5, big);
  encode(kSmallCaps, 5, small);
  Downstream d;
  d.offer = Offer::pool;
  Decoded out;
  decode({&big, &small}, d, out);
  fail_unless_equals_int(out.buffers.size(), 10);  // frames in == frames out, clip by clip
  fail_unless_equals_int(d.offered.size(), 2);
  for (size_t i = 0; i < out.buffers.size(); ++i) {
    GstBuffer* b = out.buffers[i];
    fail_unless(b->pool == d.offered[i < 5 ? 0 : 1], "frame %zu from the wrong pool", i);
    fail_unless_equals_uint64(gst_buffer_get_size(b), i < 5 ? 64 * 48 * 3 : 32 * 32 * 3);
    fail_unless_equals_uint64(GST_BUFFER_PTS(b), gst_util_uint64_scale(i % 5, GST_SECOND, 24));
  }
}
GST_END_TEST;

// Between two clips of the same caps: a flush, after which the pool must hand out buffers again.
void flush(GstHarness* h, Downstream& d) {
  fail_unless_equals_int(d.offered.size(), 1);
  fail_unless(gst_harness_push_event(h, gst_event_new_flush_start()));
  fail_unless(gst_harness_push_event(h, gst_event_new_flush_stop(TRUE)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  fail_unless(gst_harness_push_event(h, gst_event_new_segment(&segment)));
}

GST_START_TEST(test_the_pool_serves_again_after_a_flush) {
  Stream clip;
  encode(kCaps, 5, clip);
  Downstream d;
  d.offer = Offer::pool;
  Decoded out;
  decode({&clip, &clip}, d, out, flush);
  fail_unless_equals_int(out.buffers.size(), 10);
  fail_unless_equals_int(d.offered.size(), 1);
  for (GstBuffer* b : out.buffers) fail_unless(b->pool == d.offered[0]);
}
GST_END_TEST;

// Downstream asks again (RECONFIGURE) with the caps unchanged.
void reconfigure(GstHarness* h, Downstream&) {
  fail_unless(gst_pad_push_event(h->sinkpad, gst_event_new_reconfigure()));
}

GST_START_TEST(test_reconfigure_asks_downstream_again) {
  Stream first, second;
  encode(kCaps, 5, first);
  encode(kCaps, 5, second);
  Downstream d;
  d.offer = Offer::pool;
  Decoded out;
  decode({&first, &second}, d, out, reconfigure);
  fail_unless_equals_int(out.buffers.size(), 10);
  fail_unless_equals_int(d.offered.size(), 2);
  // The frames decoded after the request come from the pool offered then (the first clip's tail may be among them).
  for (size_t i = 0; i < out.buffers.size(); ++i) {
    GstBufferPool* p = out.buffers[i]->pool;
    fail_unless(p == d.offered[1] || (i < 5 && p == d.offered[0]), "frame %zu from the wrong pool", i);
    if (i > 0 && out.buffers[i - 1]->pool == d.offered[1]) fail_unless(p == d.offered[1]);
  }
}
GST_END_TEST;

}  // namespace

static Suite* vae_allocation_suite() {
  Suite* s = suite_create("vae-allocation");
  TCase* tc = tcase_create("default-model");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_without_an_offer_frames_come_from_a_video_pool_of_its_own);
  tcase_add_test(tc, test_frames_come_from_the_pool_downstream_offers);
  tcase_add_test(tc, test_padded_strides_of_downstreams_pool_hold_the_same_pixels);
  tcase_add_test(tc, test_a_pool_that_cannot_start_falls_back_with_a_warning);
  tcase_add_test(tc, test_new_caps_take_a_new_pool_and_the_old_one_is_let_go);
  tcase_add_test(tc, test_the_pool_serves_again_after_a_flush);
  tcase_add_test(tc, test_reconfigure_asks_downstream_again);
  return s;
}

GST_CHECK_MAIN(vae_allocation);

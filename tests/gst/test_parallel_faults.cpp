// A `devices` group that fails inside vaeencode and vaedecode: a rank that throws mid-stream is an ERROR message,
// and so is a group that cannot form again when the next clip starts (a flush, EOS or new caps resets the clip).
// Nothing may unwind through GStreamer's C frames: before, the reset's exception ended the process in
// std::terminate. The faults come in through the core's test hook between thread groups and their communicators,
// in this process, where the elements run.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "latent/parallel/comm.h"
#include "parallel/local_group.h"

#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include "test_models.h"

namespace {

namespace parallel = latent::parallel;
using latent_test::wan;

// Forwards to the backend's communicator; rank 1's halo exchange number `fail_at` throws.
class FailingHalo : public parallel::Communicator {
 public:
  FailingHalo(std::shared_ptr<parallel::Communicator> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  void all_reduce_sum(torch::Tensor& t) override { inner_->all_reduce_sum(t); }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override { return inner_->all_gather(t); }
  torch::Tensor all_to_all(const torch::Tensor& input) override { return inner_->all_to_all(input); }
  void exchange(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, torch::Tensor& d) override {
    if (rank() == 1 && ++calls_ == fail_at_) throw std::runtime_error("rank 1 ran out of memory (injected)");
    inner_->exchange(a, b, c, d);
  }
  void abort(const std::string& why) noexcept override { inner_->abort(why); }

 private:
  std::shared_ptr<parallel::Communicator> inner_;
  int fail_at_;
  int calls_ = 0;
};

// The first group works until rank 1's third halo exchange; every later group fails to form.
void install_faults() {
  auto groups = std::make_shared<std::atomic<int>>(0);
  parallel::testing::set_communicator_hook(
      [groups](std::shared_ptr<parallel::Communicator> made,
               const std::string& name) -> std::shared_ptr<parallel::Communicator> {
        // Each group asks for two communicators per rank; the halo one of rank 0 comes first in each group.
        if (name == "halo" && made->rank() == 0) ++*groups;
        if (*groups > 1) throw std::runtime_error("the group cannot form again (injected)");
        if (name == "halo") return std::make_shared<FailingHalo>(made, 3);
        return made;
      });
}

std::string bus_errors(GstBus* bus) {
  std::string all;
  while (GstMessage* msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR)) {
    GError* err = nullptr;
    gst_message_parse_error(msg, &err, nullptr);
    all += std::string(err->message) + "\n";
    g_clear_error(&err);
    gst_message_unref(msg);
  }
  return all;
}

GstFlowReturn push_frames(GstHarness* h, int n) {
  GstFlowReturn r = GST_FLOW_OK;
  for (int i = 0; i < n && r == GST_FLOW_OK; ++i) {
    GstBuffer* b = gst_harness_create_buffer(h, 64 * 48 * 3);
    gst_buffer_memset(b, 0, guint8(30 + 11 * i), 64 * 48 * 3);
    GST_BUFFER_PTS(b) = gst_util_uint64_scale(i, GST_SECOND, 24);
    GST_BUFFER_DURATION(b) = GST_SECOND / 24;
    r = gst_harness_push(h, b);
  }
  return r;
}

GST_START_TEST(test_a_group_that_cannot_form_again_is_an_error) {
  install_faults();
  GstHarness* h = gst_harness_new_parse(("vaeencode chunk-frames=1 devices=cpu,cpu model=" + wan()).c_str());
  GstBus* bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  gst_harness_set_src_caps_str(h, "video/x-raw,format=RGB,width=64,height=48,framerate=24/1");
  fail_unless_equals_int(push_frames(h, 20), GST_FLOW_ERROR);
  std::string errors = bus_errors(bus);
  fail_unless(errors.find("injected") != std::string::npos, "got '%s'", errors.c_str());
  // A flushing seek restarts the clip: the failed group is re-formed, which fails again; the element says so.
  fail_unless(gst_harness_push_event(h, gst_event_new_flush_start()));
  gst_harness_push_event(h, gst_event_new_flush_stop(TRUE));
  errors = bus_errors(bus);
  fail_unless(errors.find("cannot form again") != std::string::npos, "got '%s'", errors.c_str());
  // And EOS, which resets the clip too.
  gst_harness_push_event(h, gst_event_new_eos());
  errors = bus_errors(bus);
  fail_unless(errors.find("cannot form again") != std::string::npos, "got '%s'", errors.c_str());
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
  parallel::testing::set_communicator_hook({});
}
GST_END_TEST;

Suite* faults_suite() {
  Suite* s = suite_create("parallel-faults");
  TCase* tc = tcase_create("faults");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_a_group_that_cannot_form_again_is_an_error);
  return s;
}

}  // namespace

GST_CHECK_MAIN(faults);

// A `devices` group that fails inside vaeencode and vaedecode: a rank that throws mid-stream is an ERROR message,
// and so is a group that cannot form again when the next clip starts (a flush, EOS or new caps resets the clip).
// Nothing may unwind through GStreamer's C frames: before, the reset's exception ended the process in
// std::terminate. The faults come in through the core's test hook between thread groups and their communicators,
// in this process, where the elements run.
//
// videogen's ranks likewise: a rank that throws in its exchange ends the pipeline at once, well before the rank
// timeout, with an ERROR naming that rank and its cause; a rank that stalls in it ends the pipeline once the
// rank-timeout has passed, never a hang; and the same pipeline taken to NULL and played again forms a new group and
// makes the one-device latents.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <sys/wait.h>
#include <torch/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "latent/parallel/comm.h"
#include "parallel/local_group.h"

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include "check_main.h"
#include "pipeline_run.h"
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

// ---- videogen ------------------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

enum class Fault { throws, stalls };

// Forwards to the backend's communicator; rank 1's all-gather number `at` (the exchange of an iteration's
// predictions) throws, or blocks as an NCCL kernel whose peer never comes does, until the group aborts it.
class FaultyGather : public parallel::Communicator {
 public:
  FaultyGather(std::shared_ptr<parallel::Communicator> inner, Fault fault, int at,
               std::shared_ptr<std::atomic<Clock::rep>> fault_time)
      : inner_(std::move(inner)), fault_(fault), at_(at), fault_time_(std::move(fault_time)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  void all_reduce_sum(torch::Tensor& t) override { inner_->all_reduce_sum(t); }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    if (rank() != 1 || ++calls_ != at_) return inner_->all_gather(t);
    fault_time_->store(Clock::now().time_since_epoch().count());
    // Deliberately free of the words "rank" and "1": the element's message must name the rank itself.
    if (fault_ == Fault::throws) throw std::runtime_error("the device ran out of memory (injected)");
    std::unique_lock<std::mutex> lock(mutex_);
    // Bounded, so that a group that never aborts fails the test instead of hanging it.
    if (!aborted_.wait_for(lock, std::chrono::seconds(60), [&] { return !why_.empty(); }))
      throw std::runtime_error("stalled for 60 s and nobody aborted the group");
    throw std::runtime_error("aborted: " + why_);
  }
  torch::Tensor all_to_all(const torch::Tensor& input) override { return inner_->all_to_all(input); }
  void exchange(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, torch::Tensor& d) override {
    inner_->exchange(a, b, c, d);
  }
  void abort(const std::string& why) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      why_ = why.empty() ? "aborted" : why;
    }
    aborted_.notify_all();
    inner_->abort(why);
  }

 private:
  std::shared_ptr<parallel::Communicator> inner_;
  Fault fault_;
  int at_;
  std::shared_ptr<std::atomic<Clock::rep>> fault_time_;
  int calls_ = 0;
  std::mutex mutex_;
  std::condition_variable aborted_;
  std::string why_;
};

// Only the first group formed after this faults (in its second exchange); the groups formed later are sound.
// Returns where the time of the fault goes.
std::shared_ptr<std::atomic<Clock::rep>> install_gather_fault(Fault fault) {
  auto groups = std::make_shared<std::atomic<int>>(0);
  auto when = std::make_shared<std::atomic<Clock::rep>>(0);
  parallel::testing::set_communicator_hook(
      [groups, when, fault](std::shared_ptr<parallel::Communicator> made,
                            const std::string& name) -> std::shared_ptr<parallel::Communicator> {
        // Each group has one rank 1 and joins it once (no Ulysses here): it counts the groups.
        if (name != "collectives" || made->rank() != 1 || ++*groups > 1) return made;
        return std::make_shared<FaultyGather>(made, fault, 2, when);
      });
  return when;
}

std::string small_generator() {
  const char* d = g_getenv("LATENT_SMALL_DENOISER_FIXTURES");
  const std::string model = d ? std::string(d) + "/model.safetensors" : "";
  return std::filesystem::exists(model) ? model : "";
}

std::string pipeline_wan() {
  const char* d = g_getenv("LATENT_PIPELINE_FIXTURES");
  const std::string dir = d ? std::string(d) : "";
  return !dir.empty() && std::filesystem::exists(dir + "/stamp") ? dir + "/wan" : "";
}

struct GenRun {
  std::string name, base, devices;
};

// fifo's partitions on the small generator (no text) and CFG on the tiny Wan pipeline (from a prompt).
std::vector<GenRun> gen_runs() {
  std::vector<GenRun> runs;
  if (!small_generator().empty())
    runs.push_back({"fifo partitions",
                    "videogen name=gen model=" + small_generator() +
                        " width=64 height=48 steps=4 window=2 schedule=fifo num-frames=13 ",
                    "devices=cpu,cpu parallel=partitions=2"});

  if (!pipeline_wan().empty())
    runs.push_back({"cfg",
                    "videogen name=gen model=" + pipeline_wan() +
                        " width=96 height=64 num-frames=17 schedule=clip steps=2 guidance-scale=5 prompt=fox ",
                    "devices=cpu,cpu parallel=cfg=2"});

  return runs;
}

// Every float of the buffers, in order.
std::vector<float> floats_of(const std::vector<GstBuffer*>& buffers) {
  std::vector<float> all;
  for (GstBuffer* b : buffers) {
    GstMapInfo m;
    gst_buffer_map(b, &m, GST_MAP_READ);
    const auto* f = reinterpret_cast<const float*>(m.data);
    all.insert(all.end(), f, f + m.size / sizeof(float));
    gst_buffer_unmap(b, &m);
  }
  return all;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The pipeline's ERROR (empty when it reached EOS instead), and when it came.
std::string wait_for_end(GstElement* pipeline, Clock::time_point* when = nullptr) {
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* msg =
      gst_bus_timed_pop_filtered(bus, 120 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  if (when) *when = Clock::now();
  gst_object_unref(bus);
  fail_unless(msg != nullptr, "the pipeline neither ended nor failed within 120 s");
  std::string error;
  if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gst_message_parse_error(msg, &e, nullptr);
    error = e->message;
    g_clear_error(&e);
  }
  gst_message_unref(msg);
  return error;
}

std::vector<GstBuffer*> pull_all(GstElement* pipeline) {
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  std::vector<GstBuffer*> out;
  while (GstSample* s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND)) {
    out.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  gst_object_unref(sink);
  return out;
}

void unref_all(std::vector<GstBuffer*>& buffers) {
  for (GstBuffer* b : buffers) gst_buffer_unref(b);
  buffers.clear();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// One run with the fault: its ERROR must say `expect` (each part), come between `at_least` and `at_most` after the
// fault, and the same pipeline, to NULL and playing again, must make the one-device latents.
void fault_then_recover(const GenRun& r, Fault fault, const std::string& timeout,
                        const std::vector<std::string>& expect, std::chrono::milliseconds at_least,
                        std::chrono::milliseconds at_most) {
  latent_test::Out one;
  latent_test::run(r.base + "! appsink name=out", one);
  fail_unless(one.error.empty(), "%s, one device: %s", r.name.c_str(), one.error.c_str());
  fail_unless(!one.buffers.empty(), "%s, one device: no latents", r.name.c_str());

  const auto fault_time = install_gather_fault(fault);
  const std::string desc =
      r.base + r.devices + " rank-timeout=" + timeout + " ! appsink name=out sync=false max-buffers=0";
  GError* err = nullptr;
  GstElement* pipeline = gst_parse_launch(desc.c_str(), &err);
  fail_unless(pipeline != nullptr, "cannot build %s: %s", desc.c_str(), err ? err->message : "?");
  g_clear_error(&err);

  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  Clock::time_point ended;
  const std::string error = wait_for_end(pipeline, &ended);
  g_print("%s, rank 1 %s: %s\n", r.name.c_str(), fault == Fault::throws ? "throws" : "stalls", error.c_str());
  fail_unless(fault_time->load() != 0, "%s: the fault was never reached (%s)", r.name.c_str(), error.c_str());
  for (const auto& part : expect)
    fail_unless(contains(error, part), "%s: the error does not say '%s': '%s'", r.name.c_str(), part.c_str(),
                error.c_str());
  const auto took = ended - Clock::time_point(Clock::duration(fault_time->load()));
  g_print("%s: the error came %.2f s after the fault\n", r.name.c_str(), std::chrono::duration<double>(took).count());
  fail_unless(took >= at_least && took <= at_most, "%s: the error came %.2f s after the fault", r.name.c_str(),
              std::chrono::duration<double>(took).count());

  // A new group forms when the pipeline plays again; it is sound, and makes what one device makes.
  fail_unless_equals_int(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  std::vector<GstBuffer*> again = pull_all(pipeline);
  const std::string after = wait_for_end(pipeline);
  fail_unless(after.empty(), "%s, played again: %s", r.name.c_str(), after.c_str());
  fail_unless_equals_int(again.size(), one.buffers.size());
  const double rel = relative_error(floats_of(again), floats_of(one.buffers));
  g_print("%s, played again: %.2e relative to one device\n", r.name.c_str(), rel);
  fail_unless(rel <= 1e-5, "%s, played again: %g relative to one device", r.name.c_str(), rel);
  unref_all(again);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  parallel::testing::set_communicator_hook({});
}

// The default rank-timeout is a minute: the failing rank's own error must end every rank long before.
GST_START_TEST(test_videogen_rank_that_throws_is_an_error_at_once) {
  for (const GenRun& r : gen_runs())
    fault_then_recover(r, Fault::throws, "60", {"rank 1", "ran out of memory (injected)"}, std::chrono::milliseconds(0),
                       std::chrono::seconds(10));
}
GST_END_TEST;

// A rank that never comes to the exchange: the others wait rank-timeout for it, then the error says so.
GST_START_TEST(test_videogen_rank_that_stalls_times_out) {
  for (const GenRun& r : gen_runs())
    fault_then_recover(r, Fault::stalls, "1", {"rank 1", "waited 1"}, std::chrono::milliseconds(900),
                       std::chrono::seconds(15));
}
GST_END_TEST;

// videogen's ranks as processes (torchrun's environment): this process is rank 0, a gst-launch-1.0 child rank 1.
// A seek would restart one process's schedule alone, so it is refused with a warning and the stream goes on to
// the end in step with the other process; a rank that stops mid-run tells the other, which ends at once with an
// ERROR naming it instead of waiting out its rank-timeout.
struct ChildRank {
  GPid pid = 0;
  std::string log;
  // Waits for the child; its exit status.
  int wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    g_spawn_close_pid(pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  std::string said() const {
    std::ifstream in(log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

ChildRank spawn_rank1(const std::string& props, int port, const std::string& tag) {
  ChildRank c;
  c.log =
      (std::filesystem::temp_directory_path() / ("rank1-" + tag + "-" + std::to_string(getpid()) + ".log")).string();
  gchar** env = g_get_environ();
  for (const auto& [k, v] : std::vector<std::pair<const char*, std::string>>{{"RANK", "1"},
                                                                             {"LOCAL_RANK", "1"},
                                                                             {"WORLD_SIZE", "2"},
                                                                             {"MASTER_ADDR", "127.0.0.1"},
                                                                             {"MASTER_PORT", std::to_string(port)},
                                                                             {"OMP_NUM_THREADS", "1"}})
    env = g_environ_setenv(env, k, v.c_str(), TRUE);
  const std::string cmd = "exec gst-launch-1.0 -q videogen " + props + " ! fakesink >" + c.log + " 2>&1";
  const gchar* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  GError* err = nullptr;
  fail_unless(
      g_spawn_async(nullptr, const_cast<gchar**>(argv), env, G_SPAWN_DO_NOT_REAP_CHILD, nullptr, nullptr, &c.pid, &err),
      "cannot start rank 1: %s", err ? err->message : "?");
  g_strfreev(env);
  return c;
}

void be_rank0(int port) {
  g_setenv("RANK", "0", TRUE);
  g_setenv("LOCAL_RANK", "0", TRUE);
  g_setenv("WORLD_SIZE", "2", TRUE);
  g_setenv("MASTER_ADDR", "127.0.0.1", TRUE);
  g_setenv("MASTER_PORT", std::to_string(port).c_str(), TRUE);
}

void be_alone() {
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) g_unsetenv(k);
}

GST_START_TEST(test_process_ranks_refuse_seeks_and_tell_when_they_stop) {
  const std::string props = "model=" + small_generator() +
                            " width=64 height=48 steps=4 window=2 schedule=fifo parallel=partitions=2 rank-timeout=60";
  g_setenv("OMP_NUM_THREADS", "1", TRUE);
  latent_test::Out alone;
  latent_test::run("videogen " + props.substr(0, props.find(" parallel")) + " num-frames=13 ! appsink name=out", alone);
  fail_unless(alone.error.empty(), "%s", alone.error.c_str());

  // A seek mid-stream: refused with a warning, and both processes still make the one-process latents.
  const int port = 20000 + int(getpid() % 20000);
  ChildRank child = spawn_rank1(props + " num-frames=13", port, "seek");
  be_rank0(port);
  GstElement* pipeline =
      gst_parse_launch(("videogen " + props + " num-frames=13 ! appsink name=out sync=false").c_str(), nullptr);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  std::vector<GstBuffer*> got;
  GstSample* first = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND);
  fail_unless(first != nullptr, "no latent from rank 0: rank 1 said %s", child.said().c_str());
  got.push_back(gst_buffer_ref(gst_sample_get_buffer(first)));
  gst_sample_unref(first);
  fail_if(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), 0),
          "a seek was accepted with ranks as processes");
  while (GstSample* smp = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND)) {
    got.push_back(gst_buffer_ref(gst_sample_get_buffer(smp)));
    gst_sample_unref(smp);
  }
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* warning = gst_bus_pop_filtered(bus, GST_MESSAGE_WARNING);
  fail_unless(warning != nullptr, "no warning for the refused seek");
  GError* e = nullptr;
  gst_message_parse_warning(warning, &e, nullptr);
  fail_unless(std::strstr(e->message, "ranks as processes") != nullptr, "%s", e->message);
  g_clear_error(&e);
  gst_message_unref(warning);
  gst_object_unref(bus);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  fail_unless_equals_int(child.wait(), 0);
  fail_unless_equals_int(got.size(), alone.buffers.size());
  fail_unless(floats_of(got) == floats_of(alone.buffers), "the latents differ from one process's");
  unref_all(got);

  // A live rank paused and played again: its step ends in step with the other process, which waits for it, and
  // both go on to the one-process latents.
  child = spawn_rank1(props + " num-frames=13 is-live=true", port + 2, "pause");
  be_rank0(port + 2);
  pipeline =
      gst_parse_launch(("videogen " + props + " num-frames=13 is-live=true ! appsink name=out").c_str(), nullptr);
  sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstSample* live = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND);
  fail_unless(live != nullptr, "no live latent from rank 0: rank 1 said %s", child.said().c_str());
  got.push_back(gst_buffer_ref(gst_sample_get_buffer(live)));
  gst_sample_unref(live);
  gst_element_set_state(pipeline, GST_STATE_PAUSED);
  g_usleep(G_USEC_PER_SEC / 2);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  while (GstSample* smp = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND)) {
    got.push_back(gst_buffer_ref(gst_sample_get_buffer(smp)));
    gst_sample_unref(smp);
  }
  fail_unless_equals_string(wait_for_end(pipeline).c_str(), "");
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  fail_unless_equals_int(child.wait(), 0);
  fail_unless_equals_int(got.size(), alone.buffers.size());
  fail_unless(floats_of(got) == floats_of(alone.buffers), "paused and played again, the latents differ");
  unref_all(got);

  // Rank 0 leaves an endless run: rank 1 ends well before its minute of rank-timeout, naming rank 0.
  child = spawn_rank1(props, port + 1, "leave");
  be_rank0(port + 1);
  pipeline = gst_parse_launch(("videogen " + props + " ! appsink name=out sync=false").c_str(), nullptr);
  sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstSample* one = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 120 * GST_SECOND);
  fail_unless(one != nullptr, "no latent from rank 0: rank 1 said %s", child.said().c_str());
  gst_sample_unref(one);
  const auto left = Clock::now();
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  be_alone();
  const int status = child.wait();
  const double waited = std::chrono::duration<double>(Clock::now() - left).count();
  const std::string said = child.said();
  fail_unless(status != 0, "rank 1 went on without rank 0");
  // Told by rank 0 that it stopped, or, where rank 0's store went first, that rank 0 is gone.
  fail_unless(said.find("rank 0") != std::string::npos, "rank 1 said: %s", said.c_str());
  fail_unless(waited < 30, "rank 1 took %.1f s to end", waited);
  std::remove(child.log.c_str());
}
GST_END_TEST;

Suite* faults_suite() {
  Suite* s = suite_create("parallel-faults");
  TCase* tc = tcase_create("faults");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_a_group_that_cannot_form_again_is_an_error);
  tcase_add_test(tc, test_videogen_rank_that_throws_is_an_error_at_once);
  tcase_add_test(tc, test_videogen_rank_that_stalls_times_out);
  if (!small_generator().empty()) tcase_add_test(tc, test_process_ranks_refuse_seeks_and_tell_when_they_stop);
  if (small_generator().empty())
    latent_test::skip_missing("videogen fifo partitions: no small generator (LATENT_SMALL_DENOISER_FIXTURES unset)");
  if (pipeline_wan().empty())
    latent_test::skip_missing("videogen cfg: no pipeline fixtures (LATENT_PIPELINE_FIXTURES unset)");
  return s;
}

}  // namespace

LATENT_CHECK_MAIN(faults);

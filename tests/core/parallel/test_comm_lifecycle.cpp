// The life of a group's communicators on the CPU: what the store backend leaves in its store, a group whose rank
// fails while the others form it, the watchdog that gives queued collectives their deadlines, and which
// communicators the generator forms.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "latent/gen/parallel_generator.h"
#include "latent/parallel/comm.h"
#include "latent/runtime/default_model.h"
#include "parallel/local_group.h"
#include "parallel/rank_threads.h"
#include "parallel/store_comm.h"
#include "parallel/watchdog.h"

using namespace latent;
using namespace std::chrono_literals;

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// Every kind of call, in the order a Ulysses layer and a patch-parallel decoder make them, with their results
// checked: rank r holds r + 1.
void one_round(parallel::Communicator& c) {
  const int r = c.rank(), n = c.size();
  const std::vector<torch::Tensor> gathered = c.all_gather(torch::full({2, 3}, double(r + 1)));
  for (int k = 0; k < n; ++k) ASSERT_TRUE(torch::equal(gathered[size_t(k)], torch::full({2, 3}, double(k + 1))));
  const torch::Tensor swapped = c.all_to_all(torch::full({n, 4}, double(r + 1)));
  for (int k = 0; k < n; ++k) ASSERT_TRUE(torch::equal(swapped[k], torch::full({4}, double(k + 1))));
  torch::Tensor sum = torch::full({5}, double(r + 1));
  c.all_reduce_sum(sum);
  ASSERT_TRUE(torch::equal(sum, torch::full({5}, double(n * (n + 1) / 2))));
  torch::Tensor to_prev, to_next, from_prev, from_next;
  if (r > 0) to_prev = torch::full({3}, double(r + 1)), from_prev = torch::empty({3});
  if (r + 1 < n) to_next = torch::full({3}, double(r + 1)), from_next = torch::empty({3});
  c.exchange(to_prev, to_next, from_prev, from_next);
  if (r > 0) ASSERT_TRUE(torch::equal(from_prev, torch::full({3}, double(r))));
  if (r + 1 < n) ASSERT_TRUE(torch::equal(from_next, torch::full({3}, double(r + 2))));
}

// The store backend forms as NCCL does while one lives.
struct FormationWaits {
  FormationWaits() { parallel::testing::set_store_formation_waits(true); }
  ~FormationWaits() { parallel::testing::set_store_formation_waits(false); }
};

}  // namespace

// A collective's keys are gone once every rank has read them, whatever call comes next: an all_gather followed by
// an all_to_all used to leave the gathered data in the store for good, one collective's worth per round.
TEST(StoreComm, KeysDoNotPileUpOverManyCollectives) {
  constexpr int kRanks = 3, kRounds = 40;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<parallel::StoreCommunicator>> comms;
  for (int r = 0; r < kRanks; ++r)
    comms.push_back(std::make_shared<parallel::StoreCommunicator>(store, "collectives", r, kRanks, 30s));
  parallel::RankThreads threads(kRanks);
  std::vector<int64_t> keys;
  for (int round = 0; round < kRounds; ++round) {
    threads.run([&](int r) { one_round(*comms[size_t(r)]); }, [](int, std::exception_ptr) {});
    keys.push_back(store->getNumKeys());
  }
  for (int round = 0; round < kRounds; ++round) EXPECT_EQ(keys[size_t(round)], 0) << "after round " << round + 1;
}

// NCCL forms a communicator with every rank at once; the CPU backend waits the same way here. Rank 1 fails before
// it joins (in another group's join, say): the others, waiting in join() for it, end with its cause as soon as the
// failure callback aborts the group, not at the 60 s timeout.
TEST(GroupFormation, ARankThatFailsWhileOthersFormEndsThemWithItsCause) {
  FormationWaits waits;
  parallel::ThreadGroup group({torch::kCPU, torch::kCPU, torch::kCPU}, {.timeout = 60s});
  parallel::RankThreads threads(3);
  std::vector<std::string> seen(3);
  std::vector<parallel::ParallelError::Kind> kinds(3, parallel::ParallelError::Kind::backend);
  try {
    threads.run(
        [&](int r) {
          if (r == 1) {
            std::this_thread::sleep_for(50ms);  // the others are in join() by now, or soon
            throw std::runtime_error("out of memory on purpose");
          }
          try {
            group.join(r);
          } catch (const parallel::ParallelError& e) {
            seen[size_t(r)] = e.what(), kinds[size_t(r)] = e.kind();
            throw;
          }
        },
        [&](int r, std::exception_ptr e) { group.abort("rank " + std::to_string(r) + " failed: " + what_of(e)); });
    ADD_FAILURE() << "no error";
  } catch (const parallel::ParallelError& e) {
    ADD_FAILURE() << "the root cause, not a report of it, must come out: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "out of memory on purpose");
  }
  for (int r : {0, 2}) {
    EXPECT_EQ(kinds[size_t(r)], parallel::ParallelError::Kind::peer_failed) << "rank " << r;
    EXPECT_EQ(seen[size_t(r)], "rank 1 failed: out of memory on purpose") << "rank " << r;
  }
  // A rank that comes after the abort does not wait at all.
  try {
    group.join(1);
    ADD_FAILURE() << "joined an aborted group";
  } catch (const parallel::ParallelError& e) {
    EXPECT_EQ(e.kind(), parallel::ParallelError::Kind::peer_failed);
  }
}

// Without an abort (a failure callback that does nothing), the wait still ends: at the group's timeout, with a
// message that counts the ranks that came.
TEST(GroupFormation, WithoutAnAbortTheOthersTimeOut) {
  FormationWaits waits;
  parallel::ThreadGroup group({torch::kCPU, torch::kCPU, torch::kCPU}, {.timeout = 300ms});
  parallel::RankThreads threads(3);
  std::vector<std::string> seen(3);
  try {
    threads.run(
        [&](int r) {
          if (r == 1) throw std::runtime_error("out of memory on purpose");
          try {
            group.join(r);
          } catch (const parallel::ParallelError& e) {
            seen[size_t(r)] = e.what();
            throw;
          }
        },
        [](int, std::exception_ptr) {});
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "out of memory on purpose");
  }
  // The first to time out aborts the group with its message; the other reports that.
  for (int r : {0, 2})
    EXPECT_NE(seen[size_t(r)].find("only 2 of 3 ranks formed the halo communicator within 0.3 s"), std::string::npos)
        << "rank " << r << ": " << seen[size_t(r)];
}

// With every rank there, a waiting formation forms and works.
TEST(GroupFormation, EveryRankJoiningFormsTheGroup) {
  FormationWaits waits;
  parallel::ThreadGroup group({torch::kCPU, torch::kCPU}, {.timeout = 30s});
  parallel::RankThreads threads(2);
  threads.run([&](int r) { one_round(*group.join(r).collectives); }, [](int, std::exception_ptr) {});
}

// A call still unfinished at its deadline fires the watchdog once: the owner's abort ends the wait that the call
// holds up (a kernel, for NCCL; a condition here), and the waiter's next look throws ParallelError(timeout).
TEST(Watchdog, ACallPastItsDeadlineAbortsAndTheWaiterGetsParallelError) {
  std::mutex m;
  std::condition_variable cv;
  bool aborted = false;
  int fired = 0;
  parallel::Watchdog dog(
      [&](const parallel::Watchdog::Fired& f) {
        EXPECT_EQ(f.kind, parallel::ParallelError::Kind::timeout);
        std::lock_guard<std::mutex> lock(m);
        aborted = true;
        ++fired;
        cv.notify_all();
      },
      5ms);
  dog.watch([] { return false; }, parallel::Watchdog::Clock::now() + 50ms, "waited 0.05 s in all_to_all");
  std::string seen;
  std::thread waiter([&] {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return aborted; });
    }
    try {
      dog.check();
    } catch (const parallel::ParallelError& e) {
      EXPECT_EQ(e.kind(), parallel::ParallelError::Kind::timeout);
      seen = e.what();
    }
  });
  waiter.join();
  EXPECT_EQ(seen, "waited 0.05 s in all_to_all");
  EXPECT_TRUE(dog.fired());
  // Fired once: calls watched afterwards are not watched, nor is the abort repeated.
  dog.watch([] { return false; }, parallel::Watchdog::Clock::now(), "again");
  EXPECT_EQ(dog.in_flight(), 0u);
  std::this_thread::sleep_for(30ms);
  std::lock_guard<std::mutex> lock(m);
  EXPECT_EQ(fired, 1);
}

// Calls that finish before their deadlines are dropped, and nothing fires.
TEST(Watchdog, CallsThatFinishInTimeAreLeftAlone) {
  std::atomic<int> fired{0};
  parallel::Watchdog dog([&](const parallel::Watchdog::Fired&) { ++fired; }, 5ms);
  std::vector<std::shared_ptr<std::atomic<bool>>> done;
  for (int i = 0; i < 100; ++i) {
    done.push_back(std::make_shared<std::atomic<bool>>(false));
    dog.watch([d = done.back()] { return d->load(); }, parallel::Watchdog::Clock::now() + 1h, "late");
  }
  for (auto& d : done) d->store(true);
  while (dog.in_flight() > 0) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(fired.load(), 0);
  EXPECT_FALSE(dog.fired());
  EXPECT_NO_THROW(dog.check());
}

// Another rank's abort, seen by the probe while calls are in flight, fires with that rank's cause.
TEST(Watchdog, AProbeThatSeesAnAbortFiresWithItsCause) {
  std::atomic<bool> peer_aborted{false};
  std::promise<parallel::Watchdog::Fired> got;
  parallel::Watchdog dog([&](const parallel::Watchdog::Fired& f) { got.set_value(f); }, 5ms,
                         [&]() -> std::optional<parallel::Watchdog::Fired> {
                           if (!peer_aborted) return std::nullopt;
                           return parallel::Watchdog::Fired{parallel::ParallelError::Kind::peer_failed,
                                                            "rank 2 failed: out of memory on purpose"};
                         });
  dog.watch([] { return false; }, parallel::Watchdog::Clock::now() + 1h, "late");
  peer_aborted = true;
  const parallel::Watchdog::Fired f = got.get_future().get();
  EXPECT_EQ(f.kind, parallel::ParallelError::Kind::peer_failed);
  EXPECT_EQ(f.why, "rank 2 failed: out of memory on purpose");
  try {
    dog.check();
    ADD_FAILURE() << "no error";
  } catch (const parallel::ParallelError& e) {
    EXPECT_EQ(e.kind(), parallel::ParallelError::Kind::peer_failed);
  }
}

// The generator never exchanges halos: forming its groups makes collectives communicators alone.
TEST(GroupFormation, TheGeneratorFormsNoHaloCommunicators) {
  std::mutex m;
  std::map<std::string, int> made;
  struct Counting {
    explicit Counting(parallel::testing::CommunicatorHook hook) { parallel::testing::set_communicator_hook(hook); }
    ~Counting() { parallel::testing::set_communicator_hook({}); }
  } counting([&](std::shared_ptr<parallel::Communicator> c, const std::string& name) {
    std::lock_guard<std::mutex> lock(m);
    ++made[name];
    return c;
  });
  std::shared_ptr<const Denoiser> model = load_denoiser(find_default_generator());
  GeneratorOptions o;
  o.schedule = ScheduleKind::fifo;
  o.sampler = model->spec().sampler;
  o.sampler.steps = 6;
  o.frames = 5;
  o.height = 8;
  o.width = 8;
  o.window = 2;
  ParallelGenerator g(std::vector<std::shared_ptr<const Denoiser>>(2, model), o, {.partitions = 2}, {.timeout = 30s});
  g.next();
  EXPECT_EQ(made["halo"], 0);
  EXPECT_EQ(made["collectives"], 2);
  // Groups that do exchange halos still get them.
  parallel::ThreadGroup both({torch::kCPU, torch::kCPU});
  EXPECT_NE(both.join(0).halo, nullptr);
  parallel::ThreadGroup collectives_only({torch::kCPU, torch::kCPU}, {.halo_exchange = false});
  EXPECT_EQ(collectives_only.join(0).halo, nullptr);
}

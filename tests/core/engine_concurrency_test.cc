#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/decision.h"
#include "core/engine.h"
#include "store/memory/memory_store.h"

// Randomized: several threads, each with its own io_context and several
// coroutines, hammer a few keys with two request bodies each; every request
// runs Begin -> (simulated execution) -> Complete or Release, like the
// gateway. Checks the engine's promises against a model kept under a mutex.
namespace idemgate::core {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

constexpr int kThreads = 4;
constexpr int kCoroutinesPerThread = 4;
constexpr int kRequestsPerCoroutine = 150;
constexpr int kKeys = 3;
constexpr int kRequestsPerGeneration = 25;

std::string Fingerprint(int body) { return std::string(32, static_cast<char>('A' + body)); }

struct Model {
  std::mutex mu;
  // Key -> the response stored for it (set just before Complete, so that a
  // replay can never be observed without it).
  std::map<std::string, StoredResponse> stored;
  std::map<std::string, std::string> stored_fingerprint;
  std::map<std::string, bool> executing;  // key -> an execution is running
  std::map<std::pair<std::string, std::string>, int> final_executions;
  std::vector<std::string> failures;
  // Operation id -> the outcome its original released and shared (Engine::Share).
  std::map<std::string, StoredResponse> shared;
  int proceeds = 0, replays = 0, conflicts = 0, in_flight = 0, released = 0, shares = 0;

  void Fail(std::string what) {
    std::lock_guard lock(mu);
    failures.push_back(std::move(what));
  }
};

Task<void> Client(Engine& engine, Model& model, unsigned seed) {
  std::mt19937 rng(seed);
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < kRequestsPerCoroutine; ++i) {
    // Keys come in generations so that contention moves on as keys settle.
    const int key_index = static_cast<int>(rng() % kKeys) + kKeys * (i / kRequestsPerGeneration);
    const std::string key = "t-_:_:_:r:k" + std::to_string(key_index);
    const std::string fp = Fingerprint(static_cast<int>(rng() % 2));
    KeyedRequest request;
    request.key = key;
    request.fingerprint = fp;
    request.lease = 60s;
    request.in_flight = rng() % 2 == 0 ? InFlightMode::kReject : InFlightMode::kWait;
    request.wait_timeout = 5s;

    BeginResult r = co_await engine.Begin(request);
    switch (r.outcome) {
      case BeginOutcome::kProceed: {
        {
          std::lock_guard lock(model.mu);
          ++model.proceeds;
          if (model.executing[key]) model.failures.push_back("two executions at once on " + key);
          model.executing[key] = true;
          if (model.stored.count(key) != 0) {
            model.failures.push_back("executed although a final response is stored for " + key);
          }
        }
        // The "upstream": let other coroutines of this thread run meanwhile.
        for (unsigned n = rng() % 3; n > 0; --n) co_await asio::post(ex, asio::use_awaitable);
        static constexpr int kStatuses[] = {200, 201, 409, 500, 503, 429, 422};
        const int status = kStatuses[rng() % std::size(kStatuses)];
        const Classification c = ClassifyResponse(status, false, false);
        StoredResponse response;
        response.status = status;
        response.headers = {{"X-Seed", std::to_string(seed)}, {"X-Req", std::to_string(i)}};
        response.body = key + "|" + fp + "|" + std::to_string(seed) + "/" + std::to_string(i);
        if (c.disposition == Disposition::kStore) {
          {
            std::lock_guard lock(model.mu);
            model.executing[key] = false;
            model.stored[key] = response;
            model.stored_fingerprint[key] = fp;
            ++model.final_executions[{key, fp}];
          }
          const Status s = co_await engine.Complete(r.reservation, response, 0ms);
          if (!s.ok()) model.Fail("complete failed: " + s.ToString());
        } else {
          {
            std::lock_guard lock(model.mu);
            model.executing[key] = false;
            ++model.released;
            model.shared[r.reservation.operation_id] = response;
          }
          // Waiters of this process answer with the released outcome.
          engine.Share(r.reservation, response);
          const Status s = co_await engine.Release(r.reservation);
          if (!s.ok()) model.Fail("release failed: " + s.ToString());
        }
        break;
      }
      case BeginOutcome::kReplay: {
        std::lock_guard lock(model.mu);
        ++model.replays;
        auto it = model.stored.find(key);
        if (it == model.stored.end()) {
          model.failures.push_back("replay without a stored response for " + key);
        } else if (!(r.record->response == it->second) || model.stored_fingerprint[key] != fp ||
                   r.record->fingerprint != fp) {
          model.failures.push_back("replay differs from the stored original for " + key);
        }
        break;
      }
      case BeginOutcome::kKeyReused: {
        std::lock_guard lock(model.mu);
        ++model.conflicts;
        auto it = model.stored_fingerprint.find(key);
        if (!r.conflict_in_flight && (it == model.stored_fingerprint.end() || it->second == fp)) {
          model.failures.push_back("key-reused against a completed record of the same body");
        }
        break;
      }
      case BeginOutcome::kInFlight: {
        std::lock_guard lock(model.mu);
        ++model.in_flight;
        break;
      }
      case BeginOutcome::kShared: {
        std::lock_guard lock(model.mu);
        ++model.shares;
        auto it = model.shared.find(r.shared->operation_id);
        if (!r.waited) model.failures.push_back("a shared outcome for a request that did not wait on " + key);
        if (it == model.shared.end() || !(it->second == r.shared->response)) {
          model.failures.push_back("a shared outcome no original released for " + key);
        }
        break;
      }
      case BeginOutcome::kStoreError:
        model.Fail("store error: " + r.status.ToString());
        break;
      case BeginOutcome::kCancelled:
      case BeginOutcome::kClientGone:
        model.Fail("cancelled without a cancel hook");
        break;
    }
  }
}

TEST(EngineConcurrencyTest, AtMostOneExecutionPerKeyAndReplaysMatchTheOriginal) {
  FakeClock clock;
  store::memory::MemoryStore store(64 << 20, clock, 4);
  Engine engine(store, clock);
  Model model;

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      asio::io_context ctx;
      for (int c = 0; c < kCoroutinesPerThread; ++c) {
        const unsigned seed = static_cast<unsigned>(1000 * t + c + 1);
        asio::co_spawn(ctx, Client(engine, model, seed), [&](std::exception_ptr e) {
          if (e) model.Fail("coroutine threw");
        });
      }
      ctx.run();
    });
  }
  for (auto& th : threads) th.join();

  for (const std::string& f : model.failures) ADD_FAILURE() << f;
  for (const auto& [key_fp, n] : model.final_executions) {
    EXPECT_EQ(n, 1) << key_fp.first;
  }
  EXPECT_FALSE(model.stored.empty());
  for (const auto& [key, response] : model.stored) {
    auto rec = store.GetNow(key, clock.NowMillis());
    ASSERT_TRUE(rec.ok());
    ASSERT_TRUE(rec->has_value());
    EXPECT_EQ((*rec)->state, RecordState::kCompleted);
    EXPECT_EQ((*rec)->response, response);
  }
  std::printf("proceeds=%d replays=%d conflicts=%d in_flight=%d released=%d shares=%d keys=%zu\n",
              model.proceeds, model.replays, model.conflicts, model.in_flight, model.released, model.shares,
              model.stored.size());
  EXPECT_GT(model.replays, 0);
  EXPECT_GT(model.conflicts, 0);
  EXPECT_EQ(store.watchers(), 0u);
  EXPECT_EQ(engine.waited_keys(), 0u);
  EXPECT_EQ(model.proceeds + model.replays + model.conflicts + model.in_flight + model.shares,
            kThreads * kCoroutinesPerThread * kRequestsPerCoroutine);
}

}  // namespace
}  // namespace idemgate::core

// Randomized model check (after LevelDB's ModelDB): the same random sequence
// of operations goes to the memory store (the model) and to the embedded
// store, and every result is compared step by step. The embedded store is
// also reopened, swept and compacted at random points, none of which may
// change what it answers.
//
// Reproduce a failure with IDEMGATE_MODEL_SEED=<seed> (printed on failure);
// IDEMGATE_MODEL_STEPS overrides the number of steps per seed (400).
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "contract/store_helpers.h"
#include "fakes/testing.h"
#include "store/embedded/embedded_store.h"
#include "store/memory/memory_store.h"

namespace idemgate::contract {
namespace {

using core::Record;
using core::ReserveResult;
using store::embedded::EmbeddedStore;
using store::memory::MemoryStore;

std::string Describe(const Status& s) {
  return s.ok() ? "OK" : std::string(StatusCodeName(s.code()));
}

std::string Describe(const std::optional<Record>& r) {
  if (!r) return "none";
  std::ostringstream out;
  out << (r->state == core::RecordState::kInFlight ? "in-flight" : "completed")
      << " owner=" << r->owner << " lease=" << r->lease_expires_ms << " expires=" << r->expires_ms
      << " status=" << r->response.status << " body=" << r->response.body.size() << "B";
  return out.str();
}

std::string Describe(const StatusOr<ReserveResult>& r) {
  if (!r.ok()) return Describe(r.status());
  static const char* kNames[] = {"reserved", "taken-over", "exists"};
  return std::string(kNames[static_cast<int>(r->outcome)]) + " existing=" + Describe(r->existing);
}

std::string Describe(const StatusOr<std::optional<Record>>& r) {
  return r.ok() ? Describe(*r) : Describe(r.status());
}

class ModelTest : public ::testing::Test {
 protected:
  // `unbatched`: one operation per commit instead of the default batches.
  void OpenEmbedded(bool unbatched) {
    embedded_.reset();
    EmbeddedStore::Options o;
    o.path = dir_.Join("db");
    o.clock = &clock_;
    if (unbatched) o.max_batch = 1;
    o.sweep_interval = Duration::zero();
    auto store = EmbeddedStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    embedded_ = std::move(*store);
  }

  template <typename T>
  T Run(core::Task<T> task) {
    return RunOn(io_, std::move(task));
  }

  // Runs `steps` random operations from `seed`; stops at the first divergence.
  void RunSeed(std::uint64_t seed, int steps);

  // What the random walks exercised, to check that they reach every case.
  struct Tally {
    int outcomes[3] = {0, 0, 0};  // by core::ReserveOutcome
    int completed = 0;
    int refused = 0;
  };

  FakeClock clock_;
  testing::TempDir dir_;
  boost::asio::io_context io_;
  Tally tally_;
  std::unique_ptr<MemoryStore> model_;
  std::unique_ptr<EmbeddedStore> embedded_;
};

void ModelTest::RunSeed(std::uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  const bool unbatched = seed % 2 == 1;
  model_ = std::make_unique<MemoryStore>(std::uint64_t{1} << 30, clock_);
  OpenEmbedded(unbatched);
  ASSERT_NE(embedded_, nullptr);

  const std::vector<std::string> keys = {"t-a:p:s:r:k1", "t-a:p:s:r:k2",
                                         std::string("t-a:p:s:r:\0k3", 12)};
  const std::vector<std::string> owners = {"owner-1", "owner-2", "owner-3"};
  const std::vector<Duration> retentions = {0ms, 500ms, 1500ms, 5000ms};
  auto random_body = [&] {
    const int size = pick(10) == 0 ? 100'000 + pick(1000) : pick(300);
    std::string body(static_cast<std::size_t>(size), '\0');
    for (auto& c : body) c = static_cast<char>(rng());
    return body;
  };

  for (int step = 0; step < steps && !HasFailure(); ++step) {
    const std::string& key = keys[static_cast<std::size_t>(pick(3))];
    const std::string& owner = owners[static_cast<std::size_t>(pick(3))];
    const UnixMillis now = clock_.NowMillis();
    std::ostringstream what;
    what << "seed " << seed << " step " << step << " key#" << key.back() << ": ";
    switch (pick(20)) {
      case 0:
      case 1:
      case 2:
      case 3: {
        Record r = Reservation(owner, Fingerprint(pick(2)), now, Duration(pick(3000)));
        if (pick(4) == 0) r.expires_ms = now + pick(2000);
        auto want = Run(model_->Reserve(key, r, now));
        auto got = Run(embedded_->Reserve(key, r, now));
        if (want.ok()) ++tally_.outcomes[static_cast<int>(want->outcome)];
        what << "Reserve(" << owner << ")";
        EXPECT_EQ(Describe(got), Describe(want)) << what.str();
        if (want.ok() && got.ok()) {
          EXPECT_TRUE(got->existing == want->existing) << what.str();
        }
        break;
      }
      case 4:
      case 5:
      case 6:
      case 7: {
        // Usually the current holder, so that completions actually happen.
        std::string by = owner;
        auto current = Run(model_->Get(key, now));
        if (current.ok() && current->has_value() && pick(4) != 0) by = (*current)->owner;
        Record c = Completion(Reservation(by, Fingerprint(pick(2)), now), now,
                              retentions[static_cast<std::size_t>(pick(4))], 200 + pick(300),
                              random_body());
        auto want = Run(model_->Complete(key, by, c));
        auto got = Run(embedded_->Complete(key, by, c));
        ++(want.ok() ? tally_.completed : tally_.refused);
        what << "Complete(" << by << ")";
        EXPECT_EQ(Describe(got), Describe(want)) << what.str();
        break;
      }
      case 8:
      case 9: {
        std::string by = owner;
        auto current = Run(model_->Get(key, now));
        if (current.ok() && current->has_value() && pick(2) != 0) by = (*current)->owner;
        auto want = Run(model_->Release(key, by));
        auto got = Run(embedded_->Release(key, by));
        what << "Release(" << by << ")";
        EXPECT_EQ(Describe(got), Describe(want)) << what.str();
        break;
      }
      case 10:
      case 11:
      case 12: {
        auto want = Run(model_->Get(key, now));
        auto got = Run(embedded_->Get(key, now));
        what << "Get";
        EXPECT_EQ(Describe(got), Describe(want)) << what.str();
        if (want.ok() && got.ok()) {
          EXPECT_TRUE(*got == *want) << what.str();
        }
        break;
      }
      case 13: {
        // An expired record is absent to Purge as to Get, whenever each store
        // reclaims it (the model often reclaims it here, on the Get), so the
        // answers agree whether the record is live or not.
        auto live = Run(model_->Get(key, now));
        const core::PurgeMode mode = pick(2) == 0 ? core::PurgeMode::kAny : core::PurgeMode::kUnlessInFlight;
        auto want = Run(model_->Purge(key, mode, now));
        auto got = Run(embedded_->Purge(key, mode, now));
        what << "Purge(" << (mode == core::PurgeMode::kAny ? "any" : "unless in flight") << ")";
        ASSERT_TRUE(want.ok() && got.ok()) << what.str() << Describe(got.status());
        if (live.ok()) {
          EXPECT_EQ(want->outcome == core::PurgeOutcome::kAbsent, !live->has_value()) << what.str();
        }
        EXPECT_EQ(got->outcome, want->outcome) << what.str();
        EXPECT_EQ(got->state, want->state) << what.str();
        EXPECT_EQ(got->lease_expires_ms, want->lease_expires_ms) << what.str();
        break;
      }
      case 14:
      case 15:
      case 16:
      case 17:
        clock_.Advance(Duration(pick(2000)));
        break;
      case 18:
        ASSERT_TRUE(embedded_->SweepExpired(clock_.NowMillis(), 1 + pick(3)).ok());
        break;
      default:
        if (pick(2) == 0) {
          OpenEmbedded(unbatched);
          ASSERT_NE(embedded_, nullptr) << what.str() << "reopen";
        } else {
          ASSERT_TRUE(embedded_->CompactAll().ok());
        }
        break;
    }
  }
  // At the end every key must agree.
  for (const std::string& key : keys) {
    auto want = Run(model_->Get(key, clock_.NowMillis()));
    auto got = Run(embedded_->Get(key, clock_.NowMillis()));
    EXPECT_TRUE(want.ok() && got.ok() && *want == *got)
        << "seed " << seed << " final state of key#" << key.back() << ": " << Describe(got)
        << " vs model " << Describe(want);
  }
  embedded_.reset();
  model_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_.Join("db"), ec);
  if (HasFailure()) {
    std::cerr << "model test diverged; reproduce with IDEMGATE_MODEL_SEED=" << seed << "\n";
  }
}

TEST_F(ModelTest, EmbeddedStoreBehavesLikeTheMemoryStore) {
  const char* steps_env = std::getenv("IDEMGATE_MODEL_STEPS");
  const int steps = steps_env ? std::atoi(steps_env) : 400;
  if (const char* seed = std::getenv("IDEMGATE_MODEL_SEED")) {
    RunSeed(std::strtoull(seed, nullptr, 10), steps);
    return;
  }
  // Fixed seeds keep CI deterministic; IDEMGATE_MODEL_SEED explores others.
  for (std::uint64_t seed = 1; seed <= 8 && !HasFailure(); ++seed) RunSeed(seed, steps);
  EXPECT_GT(tally_.outcomes[static_cast<int>(core::ReserveOutcome::kReserved)], 0);
  EXPECT_GT(tally_.outcomes[static_cast<int>(core::ReserveOutcome::kTakenOver)], 0);
  EXPECT_GT(tally_.outcomes[static_cast<int>(core::ReserveOutcome::kExists)], 0);
  EXPECT_GT(tally_.completed, 0);
  EXPECT_GT(tally_.refused, 0);
  std::cout << "reserved " << tally_.outcomes[0] << ", taken over " << tally_.outcomes[1]
            << ", exists " << tally_.outcomes[2] << ", completed " << tally_.completed
            << ", completions refused " << tally_.refused << "\n";
}

}  // namespace
}  // namespace idemgate::contract

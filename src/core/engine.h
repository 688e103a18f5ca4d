#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "common/status.h"
#include "common/units.h"
#include "core/decision.h"
#include "core/record.h"
#include "core/store.h"

namespace idemgate::core {

// One keyed request as the engine sees it (SPEC §4.2).
struct KeyedRequest {
  std::string key;          // the scoped key (ScopedKey)
  std::string fingerprint;  // ComputeFingerprint
  Duration lease = std::chrono::seconds(35);  // how long a reservation holds the key
  InFlightMode in_flight = InFlightMode::kReject;
  Duration wait_timeout = std::chrono::seconds(30);  // kWait: longest attach
  // When set, asked before each attempt to reserve the key and before each
  // further wait: once it returns true (the server stopped waiting for its
  // requests: past shutdown_grace), Begin gives up with kCancelled instead.
  // A waiter woken by the release of an original cut at shutdown must not
  // take the key and run the request again while the gateway stops.
  bool (*cancelled)(const void* arg) = nullptr;
  // When set, asked (with `cancelled_arg`) before a request that waited for
  // an original (`in_flight: wait`) takes the key the original released or
  // whose lease ended: once it returns true (the client that sent the
  // request is gone), Begin gives up with kClientGone and leaves the key
  // free. Nobody would get the answer of that run, and the client that
  // closed will most likely retry. Not asked of a request that did not wait.
  bool (*abandoned)(const void* arg) = nullptr;
  const void* cancelled_arg = nullptr;
};

// The key held by a request that proceeds; hand it back to Complete or Release.
struct Reservation {
  std::string key;
  std::string owner;         // random 128-bit token, hex
  std::string fingerprint;
  std::string operation_id;  // the X-Operation-Id of this operation
  UnixMillis created_ms = 0;
  UnixMillis lease_expires_ms = 0;  // when another request may take the key over
};

enum class BeginOutcome {
  kProceed,     // the caller holds the key: forward, then Complete or Release
  kReplay,      // `record` is the completed original: answer with BuildReplay
  kKeyReused,   // 422 key-reused: the key holds another request
  kInFlight,    // 409 request-in-flight with Retry-After `retry_after`
  kStoreError,  // the store failed: `status`
  kCancelled,   // KeyedRequest::cancelled said to give up; the key was not taken
  kClientGone,  // a waiter's KeyedRequest::abandoned said its client is gone; the key was not taken
  kShared,      // a waiter whose original released the key with an outcome that is not stored (Engine::Share):
                // `shared` is that outcome, answered to the waiter too; the key was not taken
};

// What an original that released its key without storing an outcome (a
// 5xx, a 429, an upstream timeout) answered, for the requests waiting on it
// in this process (Engine::Share).
struct SharedOutcome {
  StoredResponse response;
  std::string operation_id;  // the original's
};

// Logs (warn, rate-limited) that the response of `reservation` was not
// stored because the reservation is gone: what a completion answered
// FailedPrecondition means, whether on its first attempt or a later one.
void LogReservationGone(const Reservation& reservation);

// "proceed", "replay", "key_reused", "in_flight", "store_error", "cancelled",
// "client_gone", "shared".
std::string_view BeginOutcomeName(BeginOutcome outcome);

struct BeginResult {
  BeginOutcome outcome = BeginOutcome::kStoreError;
  Reservation reservation;   // kProceed
  bool taken_over = false;   // kProceed: a reservation whose lease ended was replaced
  bool waited = false;       // the request attached to one in flight (kWait)
  // kReplay: the completed record. kKeyReused / kInFlight: the record found.
  // kProceed after a takeover: the replaced reservation.
  std::optional<Record> record;
  std::chrono::seconds retry_after{0};  // kInFlight
  bool conflict_in_flight = false;      // kKeyReused: the record found was in flight
  Status status;                        // kStoreError
  std::shared_ptr<const SharedOutcome> shared;  // kShared
  // Store errors met while waiting (kWait): each ended one look at the
  // record, and the engine looked again after a pause (50 ms doubling to
  // 1 s) until wait_timeout. Registering the watch / reading the record.
  int wait_watch_errors = 0;
  int wait_get_errors = 0;
};

enum class LookupOutcome {
  kCompleted,   // `record` holds the stored response
  kInFlight,    // still in flight after the wait; `retry_after`
  kNotFound,    // no live record
  kStoreError,  // `status`
};

struct LookupResult {
  LookupOutcome outcome = LookupOutcome::kStoreError;
  std::optional<Record> record;  // kCompleted, kInFlight
  std::chrono::seconds retry_after{0};
  Status status;
};

// Carries out the decisions of decision.h against a Store (SPEC §4):
// reserve, replay, conflict, wait for an in-flight original, take over an
// ended lease, complete and release with compare-and-set on the owner.
//
// Holds no per-request state beyond the keys its waiters wait on (Share): one
// Engine may be used concurrently from any number of threads and
// io_contexts; each coroutine resumes on the executor it was awaited on.
// `store` and `clock` must outlive it.
class Engine {
 public:
  Engine(Store& store, const Clock& clock);

  // Decides the request and, when it may run, reserves the key atomically.
  // kWait mode registers a watch before re-reading the key, then waits (up
  // to wait_timeout, waking early when the holder's lease ends) and replays
  // the landed response, reserves again when the holder released, takes
  // over when its lease ended, or answers kInFlight when the wait ran out.
  // A store error while waiting is logged, counted in the result and does
  // not end the wait: the record is read again after a pause; kInFlight
  // when the wait ran out with the store still failing.
  // kCancelled once KeyedRequest::cancelled holds (checked before each
  // reserve and each wait; a sleeping waiter sees it when it wakes), and
  // kClientGone when a waiter about to take the key finds
  // KeyedRequest::abandoned true. kShared when the holder it waited on
  // released the key after Share: the waiter answers with the holder's
  // outcome instead of running the request again.
  // Never throws.
  Task<BeginResult> Begin(KeyedRequest request);

  // Stores `response` as the final outcome of `reservation`, kept for
  // `retention` (0: until purged). FailedPrecondition when the reservation
  // was lost (released, purged or taken over): the record is then untouched.
  // Wakes waiters. On another failure of a store whose faults may pass
  // (Store::FailedWritesMayPass), the completion is tried again in the
  // background while the lease lasts (the failure is still returned); a
  // copy of `response` is kept for it on such stores only. How those
  // attempts end is logged, and told to what `on_later` made (called, with
  // `on_later_arg`, only when the background attempts start, so a caller
  // pays nothing for it on the common path; the function it returns is kept
  // by the attempts and must own what it uses): kStored when one stored the
  // response (or an earlier one that timed out is found to have landed),
  // kLost when they found the reservation gone (taken over, purged, or lost
  // by the store). Nothing is told when the store kept failing.
  enum class LaterOutcome { kStored, kLost };
  using Later = std::function<void(LaterOutcome)>;
  Task<Status> Complete(const Reservation& reservation, StoredResponse response, Duration retention,
                        Later (*on_later)(void* arg) = nullptr, void* on_later_arg = nullptr);
  // The same, for a caller that kept only the key and owner token (one more
  // store read to recover the reservation).
  Task<Status> Complete(std::string key, std::string owner, StoredResponse response,
                        Duration retention);

  // Before a Release whose outcome is not stored (SPEC §4.3: a 5xx, 408,
  // 409, 425, 429, an upstream timeout or connect failure): hands `outcome`
  // to the requests of this process waiting on `reservation`
  // (in_flight: wait), which answer with it (kShared) when the release wakes
  // them, instead of running the request again one after another, or beside
  // an upstream call that timed out but may still run. Costs an atomic load
  // when no request of this process waits on anything; kept only while one
  // waits on this key. Waiters in other processes (a shared Redis) are not
  // reached: they take the key as before. Thread-safe.
  void Share(const Reservation& reservation, StoredResponse outcome);
  // Keys requests of this process wait on now (for tests).
  std::size_t waited_keys() const { return waited_keys_.load(std::memory_order_acquire); }

  // Deletes the reservation so that a retry runs again. FailedPrecondition
  // when it is no longer held by `owner`. Wakes waiters.
  Task<Status> Release(std::string key, std::string owner);
  Task<Status> Release(const Reservation& reservation);

  // The record under `key` for recovery (SPEC §8): completed, or in flight
  // after waiting up to `wait` for it to land (0: no wait), or not found.
  Task<LookupResult> Lookup(std::string key, Duration wait);

  Store& store() const { return store_; }
  const Clock& clock() const { return clock_; }

  // 32 lower-case hex characters from 128 random bits. Thread-safe.
  static std::string NewOwnerToken();
  // "op_" + 26 Crockford base32 characters: 48 bits of `now` then 80 random
  // bits, so ids sort by creation time. Thread-safe.
  static std::string NewOperationId(UnixMillis now);

 private:
  // One attempt of Complete.
  Task<Status> CompleteOnce(const Reservation& reservation, StoredResponse response, Duration retention);
  // Complete tried again at growing delays until it lands, the key is lost,
  // or the lease is nearly over.
  Task<void> CompleteLater(Reservation reservation, StoredResponse response, Duration retention, Later later);

  // The keys requests of this process wait on (Begin, in_flight: wait), and
  // what their holder shared (Share). An entry lives while a waiter does.
  struct WaitedKey {
    int waiters = 0;
    std::string owner;  // the holder whose outcome `outcome` is
    std::shared_ptr<const SharedOutcome> outcome;
  };
  class WaiterRegistration;
  std::shared_ptr<const SharedOutcome> SharedBy(const std::string& key, const std::string& owner) const;

  Store& store_;
  const Clock& clock_;
  mutable std::mutex waited_mu_;
  std::atomic<std::size_t> waited_keys_{0};  // waited_.size(), readable without waited_mu_
  std::unordered_map<std::string, WaitedKey> waited_;
};

}  // namespace idemgate::core

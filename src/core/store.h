#pragma once

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "common/units.h"
#include "core/record.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace idemgate::core {

template <typename T>
using Task = boost::asio::awaitable<T>;

enum class ReserveOutcome {
  kReserved,   // no live record existed; the reservation was written
  kTakenOver,  // an in-flight record with an ended lease and the same fingerprint was replaced
  kExists,     // a live record exists and was left untouched; see `existing`
};

struct ReserveResult {
  ReserveOutcome outcome = ReserveOutcome::kReserved;
  // kExists: the record found. kTakenOver: the reservation that was replaced.
  std::optional<Record> existing;
};

// What Store::Purge may delete.
enum class PurgeMode {
  kAny,             // whatever the state, a reservation whose owner still runs too
  kUnlessInFlight,  // not an in-flight record whose lease lasts at `now` (lease_expires_ms > now)
};

enum class PurgeOutcome {
  kPurged,    // a record existed and was deleted
  kAbsent,    // no record; nothing deleted
  kInFlight,  // kUnlessInFlight found a reservation with a live lease; nothing deleted
};

struct PurgeResult {
  PurgeOutcome outcome = PurgeOutcome::kAbsent;
  // kPurged, kInFlight: the state of the record found; nullopt when its bytes
  // could not be decoded (it is purged all the same).
  std::optional<RecordState> state;
  // kInFlight: when its lease ends.
  UnixMillis lease_expires_ms = 0;
};

struct StoreStats {
  std::uint64_t keys = 0;   // live records (approximate for persistent stores)
  std::uint64_t bytes = 0;  // encoded bytes held (approximate)
  // Completions stored without their body because the whole record did not
  // fit (memory store at max_bytes); 0 for stores that never do that.
  std::uint64_t bodies_dropped = 0;
};

// A registration for changes to one key, made before the caller re-reads the
// key, so that a completion between the read and the wait is never missed.
// Used on one executor only; destroying it deregisters.
class Watch {
 public:
  virtual ~Watch() = default;
  // Completes when the key was completed, released or purged since the Watch
  // was made (returns true), or after `timeout` (returns false). A true may be
  // spurious: callers always re-read the key.
  virtual Task<bool> Changed(Duration timeout) = 0;
};

// Where idempotency records live. Every operation is atomic per key across
// threads, processes and (for shared stores) gateway instances. Operations
// may be called from any I/O thread concurrently and resume on the caller's
// executor. They never throw; failures are Unavailable (store unreachable),
// ResourceExhausted (bounded store full), DeadlineExceeded (timed out) or
// Internal (corrupt data).
class Store {
 public:
  virtual ~Store() = default;

  // Atomically, for `key` at time `now`:
  //  - no record, or a completed record past its retention -> writes
  //    `reservation` (state kInFlight) and returns kReserved;
  //  - an in-flight record whose lease has ended (lease_expires_ms <= now)
  //    and whose fingerprint equals reservation.fingerprint -> replaces it
  //    and returns kTakenOver with the replaced record;
  //  - otherwise writes nothing and returns kExists with the record.
  virtual Task<StatusOr<ReserveResult>> Reserve(std::string key, Record reservation,
                                                UnixMillis now) = 0;

  // Compare-and-set on the owner: replaces the in-flight record held by
  // `owner` with `completed` (state kCompleted). FailedPrecondition when the
  // key is absent, completed, or held by another owner (the lease was lost):
  // the record is then left untouched. Wakes watchers of the key. A bounded
  // store without room for `completed` whole may store it with the body
  // omitted instead (counted in StoreStats::bodies_dropped) rather than
  // refuse it: the request ran, and a refused completion lets a retry run it
  // again once the lease ends.
  virtual Task<Status> Complete(std::string key, std::string owner, Record completed) = 0;

  // Deletes the in-flight record held by `owner`. FailedPrecondition when the
  // key is not held by `owner` (nothing is deleted). Wakes watchers.
  virtual Task<Status> Release(std::string key, std::string owner) = 0;

  // The live record for `key` at `now`; nullopt when absent or past retention.
  virtual Task<StatusOr<std::optional<Record>>> Get(std::string key, UnixMillis now) = 0;

  // Atomically, for `key` at time `now`: deletes the record (kPurged) and
  // wakes watchers, or returns kAbsent when there is none. With
  // kUnlessInFlight an in-flight record whose lease has not ended
  // (lease_expires_ms > now) is left untouched and returned as kInFlight:
  // its owner may still be running the request, and a retry after the purge
  // would run it beside it. An in-flight record whose lease ended is purged
  // in either mode (a retry could take it over anyway), and so is a record
  // that cannot be decoded. A record Get no longer returns at `now` (a
  // completed record past its retention) is absent: kAbsent, with no state,
  // even if the store still held it (it may delete it then, waking no one).
  virtual Task<StatusOr<PurgeResult>> Purge(std::string key, PurgeMode mode, UnixMillis now) = 0;

  // Registers interest in changes to `key`; see Watch.
  virtual Task<StatusOr<std::unique_ptr<Watch>>> WatchKey(std::string key) = 0;

  // Ok when the store can serve requests (for /readyz).
  virtual Task<Status> Ping() = 0;

  virtual StoreStats Stats() const = 0;

  // True when a write reported as failed may still take effect later: a
  // command that timed out on a stalled network store can reach it and run
  // after the caller gave up. The engine then cleans up after a failed
  // Reserve (Engine::Begin). Stores that fail writes only before applying
  // them keep the default.
  virtual bool FailedWritesMayLand() const { return false; }
  // True when a write that failed may succeed if tried again a moment later
  // (a full disk that frees, a Redis that resumes): the engine then tries a
  // failed completion again while its lease lasts (Engine::Complete), so
  // that retries are replays rather than a second run after the lease.
  // Every store whose failed writes may land is one.
  virtual bool FailedWritesMayPass() const { return FailedWritesMayLand(); }

  // Worker threads (the gateway's I/O threads) announce themselves: Attach on
  // the thread, before it first runs `io`; Detach on the same thread after
  // it stopped running `io` for good, while `io` still exists. A store may
  // keep resources bound to `io` for operations called on that thread (the
  // Redis store keeps its connections there, so a command needs no hand-off
  // to another thread) and must release them in DetachWorker. Stores that
  // need nothing of the kind ignore both.
  virtual void AttachWorker(boost::asio::io_context& io) { (void)io; }
  virtual void DetachWorker(boost::asio::io_context& io) { (void)io; }
};

}  // namespace idemgate::core

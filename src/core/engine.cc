#include "core/engine.h"

#include "common/log.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <memory>
#include <random>

namespace idemgate::core {

namespace {

using SteadyClock = std::chrono::steady_clock;

// Fills `out` with bytes from OpenSSL's CSPRNG (or, should it ever fail, the
// OS entropy source). Every request takes 26 bytes for its owner token and
// operation id; one RAND_bytes call per 4 KiB per thread keeps the DRBG's
// locking and dispatch off the per-request path. Bytes handed out are wiped
// from the buffer.
void FillFromCsprng(unsigned char* out, std::size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) == 1) return;
  std::random_device device;
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(device());
}

void RandomBytes(unsigned char* out, std::size_t n) {
  struct Pool {
    unsigned char bytes[4096];
    std::size_t used = sizeof bytes;
  };
  thread_local Pool pool;
  if (n > sizeof pool.bytes) {
    FillFromCsprng(out, n);
    return;
  }
  if (pool.used + n > sizeof pool.bytes) {
    FillFromCsprng(pool.bytes, sizeof pool.bytes);
    pool.used = 0;
  }
  std::memcpy(out, pool.bytes + pool.used, n);
  OPENSSL_cleanse(pool.bytes + pool.used, n);
  pool.used += n;
}

// How long a waiter sleeps: until the wait ends or the holder's lease does
// (a lease that ends wakes nobody, so the waiter looks again then).
Duration NextWake(SteadyClock::time_point deadline, const Record& holder, UnixMillis now) {
  const auto left = std::chrono::duration_cast<Duration>(deadline - SteadyClock::now());
  const Duration lease_left(std::max<UnixMillis>(holder.lease_expires_ms - now, 1));
  return std::max(Duration(1), std::min(left, lease_left));
}

// The background retries below (on stores whose failed writes may land):
// waits `*delay`, then multiplies it by `factor`; a wait that would end
// after `until` on `clock` ends at `until` instead, for a last attempt
// there (with growing delays, stopping at the last one that fits would end
// the attempts up to a factor's share of the window early, though the store
// may be back in time). False once `until` has passed or that last attempt
// was made, or when the wait was cancelled (the worker stops).
Task<bool> WaitForNextAttempt(boost::asio::steady_timer& timer, Duration* delay, int factor, UnixMillis until,
                              const Clock& clock) {
  const UnixMillis now = clock.NowMillis();
  if (now >= until || *delay == Duration::max()) co_return false;
  Duration wait = *delay;
  if (now + wait.count() >= until) {
    wait = Duration(until - now);
    *delay = Duration::max();  // the last attempt
  } else {
    *delay *= factor;
  }
  timer.expires_after(wait);
  const auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
  co_return !ec;
}

// A reserve reported as failed may still land later (Store::FailedWritesMayLand:
// a paused Redis runs the timed-out script when it resumes). The request was
// refused (503) or forwarded without deduplication (fail_open), so such a
// late reservation would only hold the key, for nothing, until its lease
// ends. Its owner token is this request's alone: releasing under it a few
// times over the lease deletes it if it landed and touches nothing else.
Task<void> ReleaseIfItLands(Store& store, const Clock& clock, std::string key, std::string owner,
                            UnixMillis lease_end) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  Duration delay = std::chrono::milliseconds(250);
  // The last attempt a quarter second before the lease ends: at its end the
  // reservation is free to take over anyway.
  while (co_await WaitForNextAttempt(timer, &delay, 4, lease_end - 250, clock)) {
    (void)co_await store.Release(key, owner);
  }
}

BeginResult StoreError(Status status) {
  BeginResult r;
  r.outcome = BeginOutcome::kStoreError;
  r.status = std::move(status);
  return r;
}

// One step of waiting for the in-flight `*existing` to change. Without a
// watch, registers one and re-reads at once (registering first means a
// completion in between still wakes it); with one, sleeps until it fires,
// the wait ends or the holder's lease does, then re-reads. Updates
// `*existing` and `*now`; sets `*waited` once it slept. On a store error,
// counts it in `*errors` (wait_watch_errors or wait_get_errors) and drops the
// watch: the next step registers one again before it reads.
Task<Status> WaitAndReread(Store& store, const Clock& clock, const std::string& key,
                           SteadyClock::time_point deadline, std::unique_ptr<Watch>* watch,
                           std::optional<Record>* existing, UnixMillis* now, bool* waited, BeginResult* errors) {
  if (*watch != nullptr) {
    *waited = true;
    if (co_await (*watch)->Changed(NextWake(deadline, **existing, *now))) watch->reset();
  }
  if (*watch == nullptr) {
    StatusOr<std::unique_ptr<Watch>> made = co_await store.WatchKey(key);
    if (!made.ok()) {
      ++errors->wait_watch_errors;
      co_return made.status();
    }
    *watch = std::move(made).value();
  }
  *now = clock.NowMillis();
  StatusOr<std::optional<Record>> fresh = co_await store.Get(key, *now);
  if (!fresh.ok()) {
    ++errors->wait_get_errors;
    watch->reset();
    co_return fresh.status();
  }
  *existing = std::move(fresh).value();
  co_return Status::Ok();
}

// After a store error while waiting: sleeps `*delay` (at most until
// `deadline`), then doubles it up to kWaitRetryMax.
constexpr Duration kWaitRetryMin = std::chrono::milliseconds(50);
constexpr Duration kWaitRetryMax = std::chrono::seconds(1);

Task<void> PauseAfterStoreError(SteadyClock::time_point deadline, Duration* delay) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  timer.expires_at(std::min(deadline, SteadyClock::now() + *delay));
  *delay = std::min<Duration>(2 * *delay, kWaitRetryMax);
  (void)co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
}

}  // namespace

std::string_view BeginOutcomeName(BeginOutcome outcome) {
  switch (outcome) {
    case BeginOutcome::kProceed: return "proceed";
    case BeginOutcome::kReplay: return "replay";
    case BeginOutcome::kKeyReused: return "key_reused";
    case BeginOutcome::kInFlight: return "in_flight";
    case BeginOutcome::kStoreError: return "store_error";
    case BeginOutcome::kCancelled: return "cancelled";
    case BeginOutcome::kClientGone: return "client_gone";
    case BeginOutcome::kShared: return "shared";
  }
  return "unknown";
}

Engine::Engine(Store& store, const Clock& clock) : store_(store), clock_(clock) {}

void LogReservationGone(const Reservation& reservation) {
  static LogLimiter limiter;
  LogWarn(limiter,
          "response not stored: the reservation is gone (taken over after its lease ended, or purged, or the store "
          "lost it: a Redis restart without persistence)",
          {{"key", reservation.key}, {"operation_id", reservation.operation_id}});
}

// A request of this process waiting on a key (Begin, in_flight: wait), from
// its first wait to the end of its Begin.
class Engine::WaiterRegistration {
 public:
  WaiterRegistration(Engine& engine, const std::string& key) : engine_(engine), key_(key) {
    std::lock_guard lock(engine_.waited_mu_);
    ++engine_.waited_[key_].waiters;
    engine_.waited_keys_.store(engine_.waited_.size(), std::memory_order_release);
  }
  ~WaiterRegistration() {
    std::lock_guard lock(engine_.waited_mu_);
    const auto it = engine_.waited_.find(key_);
    if (it != engine_.waited_.end() && --it->second.waiters == 0) engine_.waited_.erase(it);
    engine_.waited_keys_.store(engine_.waited_.size(), std::memory_order_release);
  }
  WaiterRegistration(const WaiterRegistration&) = delete;
  WaiterRegistration& operator=(const WaiterRegistration&) = delete;

 private:
  Engine& engine_;
  std::string key_;
};

void Engine::Share(const Reservation& reservation, StoredResponse outcome) {
  if (waited_keys_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(waited_mu_);
  const auto it = waited_.find(reservation.key);
  if (it == waited_.end()) return;
  it->second.owner = reservation.owner;
  it->second.outcome =
      std::make_shared<const SharedOutcome>(SharedOutcome{std::move(outcome), reservation.operation_id});
}

std::shared_ptr<const SharedOutcome> Engine::SharedBy(const std::string& key, const std::string& owner) const {
  std::lock_guard lock(waited_mu_);
  const auto it = waited_.find(key);
  if (it == waited_.end() || it->second.owner != owner) return nullptr;
  return it->second.outcome;
}

std::string Engine::NewOwnerToken() {
  static constexpr char kHex[] = "0123456789abcdef";
  unsigned char bytes[16];
  RandomBytes(bytes, sizeof bytes);
  std::string out(2 * sizeof bytes, '\0');
  char* p = out.data();
  for (unsigned char b : bytes) {
    *p++ = kHex[b >> 4];
    *p++ = kHex[b & 0xf];
  }
  return out;
}

std::string Engine::NewOperationId(UnixMillis now) {
  static constexpr char kCrockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  unsigned char random[10];
  RandomBytes(random, sizeof random);
  std::string out(3 + 26, '\0');
  char* p = out.data();
  *p++ = 'o';
  *p++ = 'p';
  *p++ = '_';
  const auto t = static_cast<std::uint64_t>(now) & ((std::uint64_t{1} << 48) - 1);
  // 10 characters carry 50 bits; the top two are zero.
  for (int i = 9; i >= 0; --i) *p++ = kCrockford[(t >> (5 * i)) & 31];
  // 80 random bits, 5 per character.
  std::uint64_t hi = 0, lo = 0;
  for (int i = 0; i < 5; ++i) hi = (hi << 8) | random[i];
  for (int i = 5; i < 10; ++i) lo = (lo << 8) | random[i];
  for (int i = 7; i >= 0; --i) *p++ = kCrockford[(hi >> (5 * i)) & 31];
  for (int i = 7; i >= 0; --i) *p++ = kCrockford[(lo >> (5 * i)) & 31];
  return out;
}

Task<BeginResult> Engine::Begin(KeyedRequest request) {
  const auto deadline = SteadyClock::now() + request.wait_timeout;
  std::string owner = NewOwnerToken();
  bool waited = false;
  std::unique_ptr<Watch> watch;
  // Store errors while waiting (counted in the result) and the pause before
  // looking again after one.
  BeginResult errors;
  Duration retry_delay = kWaitRetryMin;
  Status wait_error;
  auto counted = [&errors](BeginResult r) {
    r.wait_watch_errors = errors.wait_watch_errors;
    r.wait_get_errors = errors.wait_get_errors;
    return r;
  };
  // From the first wait on: this request is one of the key's waiters, and
  // the owner of the reservation it last waited on (whose outcome it takes
  // when that owner shared one and released the key).
  std::optional<WaiterRegistration> registration;
  std::string holder;
  // The outcome the holder last waited on shared before it released the key.
  auto shared_outcome = [&]() -> std::optional<BeginResult> {
    if (!waited || holder.empty()) return std::nullopt;
    std::shared_ptr<const SharedOutcome> shared = SharedBy(request.key, holder);
    if (shared == nullptr) return std::nullopt;
    BeginResult r;
    r.outcome = BeginOutcome::kShared;
    r.shared = std::move(shared);
    r.waited = true;
    return r;
  };
  auto cancelled = [&request, &waited]() -> std::optional<BeginResult> {
    if (request.cancelled == nullptr || !request.cancelled(request.cancelled_arg)) return std::nullopt;
    BeginResult r;
    r.outcome = BeginOutcome::kCancelled;
    r.waited = waited;
    return r;
  };

  while (true) {
    // Also where a waiter comes back to when the holder released the key:
    // one woken by a release at shutdown must not take it, nor one whose
    // client has gone meanwhile (the run would answer nobody).
    if (auto r = cancelled()) co_return counted(std::move(*r));
    // An outcome shared by the holder waited on is answered even to a client
    // that only half-closed its side (nothing runs for it).
    if (auto r = shared_outcome()) co_return counted(std::move(*r));
    if (waited && request.abandoned != nullptr && request.abandoned(request.cancelled_arg)) {
      BeginResult r;
      r.outcome = BeginOutcome::kClientGone;
      r.waited = true;
      co_return counted(std::move(r));
    }
    UnixMillis now = clock_.NowMillis();
    std::string operation_id = NewOperationId(now);
    // The record goes to the store; what the reservation needs of it is kept
    // here, and the request's own strings move into the reservation at the end.
    Record reservation;
    reservation.state = RecordState::kInFlight;
    reservation.fingerprint = request.fingerprint;
    reservation.owner = owner;
    reservation.operation_id = operation_id;
    reservation.created_ms = now;
    reservation.lease_expires_ms = now + request.lease.count();
    StatusOr<ReserveResult> reserved = co_await store_.Reserve(request.key, std::move(reservation), now);
    if (!reserved.ok()) {
      if (store_.FailedWritesMayLand()) {
        boost::asio::co_spawn(co_await boost::asio::this_coro::executor,
                              ReleaseIfItLands(store_, clock_, request.key, owner, now + request.lease.count()),
                              boost::asio::detached);
      }
      co_return counted(StoreError(reserved.status()));
    }

    if (reserved->outcome != ReserveOutcome::kExists) {
      BeginResult r;
      r.outcome = BeginOutcome::kProceed;
      r.reservation = Reservation{std::move(request.key), std::move(owner), std::move(request.fingerprint),
                                  std::move(operation_id), now, now + request.lease.count()};
      r.taken_over = reserved->outcome == ReserveOutcome::kTakenOver;
      r.waited = waited;
      if (r.taken_over) r.record = std::move(reserved->existing);
      co_return counted(std::move(r));
    }

    std::optional<Record> existing = std::move(reserved->existing);
    // Decide on what was found; in wait mode, wait and look again until the
    // key is free (back to Reserve) or the wait ends.
    bool reserve_again = false;
    while (!reserve_again) {
      const Action action = Decide(existing, request.fingerprint, now, request.in_flight);
      switch (action.kind) {
        case ActionKind::kReserve:
        case ActionKind::kTakeOver:
          reserve_again = true;
          break;
        case ActionKind::kReplay: {
          BeginResult r;
          r.outcome = BeginOutcome::kReplay;
          r.record = std::move(existing);
          r.waited = waited;
          co_return counted(std::move(r));
        }
        case ActionKind::kKeyReused: {
          BeginResult r;
          r.outcome = BeginOutcome::kKeyReused;
          r.conflict_in_flight = action.conflict_in_flight;
          r.record = std::move(existing);
          r.waited = waited;
          co_return counted(std::move(r));
        }
        case ActionKind::kRejectInFlight:
        case ActionKind::kWait: {
          const bool out_of_time = SteadyClock::now() >= deadline;
          auto in_flight = [&] {
            BeginResult r;
            if (!wait_error.ok()) {
              static LogLimiter limiter;
              LogWarn(limiter, "store still failing when the wait for the request in flight ended; answering 409",
                      {{"key", request.key}, {"error", wait_error.message()}});
            }
            r.outcome = BeginOutcome::kInFlight;
            r.retry_after = action.retry_after;
            r.record = std::move(existing);
            r.waited = waited;
            return counted(std::move(r));
          };
          if (action.kind == ActionKind::kRejectInFlight || (watch != nullptr && out_of_time)) {
            co_return in_flight();
          }
          if (auto r = cancelled()) co_return counted(std::move(*r));
          if (!registration) registration.emplace(*this, request.key);
          if (existing.has_value()) holder = existing->owner;
          Status s = co_await WaitAndReread(store_, clock_, request.key, deadline, &watch, &existing, &now,
                                            &waited, &errors);
          if (s.ok()) {
            wait_error = Status::Ok();
            retry_delay = kWaitRetryMin;
            // Looked at before what the re-read found: by then another
            // gateway may have taken the released key, and waiting on that
            // one would lose what this one's holder shared.
            if (auto r = shared_outcome()) co_return counted(std::move(*r));
            break;
          }
          // The record was in flight when last read: a store error must not
          // end the wait (as a store error, fail_open would forward the
          // request beside the one running). Look again after a pause until
          // the wait ends; if the store still fails then, answer 409.
          if (wait_error.ok()) {
            static LogLimiter limiter;
            LogWarn(limiter, "store failed while waiting for the request in flight; looking again",
                    {{"key", request.key}, {"error", s.message()}});
          }
          wait_error = std::move(s);
          if (SteadyClock::now() >= deadline) co_return in_flight();
          co_await PauseAfterStoreError(deadline, &retry_delay);
          waited = true;
          break;
        }
      }
    }
  }
}

Task<Status> Engine::Complete(const Reservation& reservation, StoredResponse response, Duration retention,
                              Later (*on_later)(void* arg), void* on_later_arg) {
  // Kept only where it may be needed: it costs an allocation per header.
  std::optional<StoredResponse> kept;
  if (store_.FailedWritesMayPass()) kept = response;
  Status stored = co_await CompleteOnce(reservation, std::move(response), retention);
  if (!stored.ok() && stored.code() != StatusCode::kFailedPrecondition && kept) {
    // A named object, moved into the coroutine's parameter: GCC 12 freed the
    // closure of a temporary made in the argument list before the
    // coroutine's first call of it.
    Later later;
    if (on_later != nullptr) later = on_later(on_later_arg);
    auto executor = co_await boost::asio::this_coro::executor;
    boost::asio::co_spawn(executor, CompleteLater(reservation, std::move(*kept), retention, std::move(later)),
                          boost::asio::detached);
  }
  co_return stored;
}

// A completion the store refused (a Redis out of memory or paused a moment,
// a full disk under the embedded store).
// Until it lands, the key stays reserved and retries are told 409; once it
// lands they are replays, instead of a takeover running the request again
// after the lease. Half a second of the lease is left for the last attempt.
Task<void> Engine::CompleteLater(Reservation reservation, StoredResponse response, Duration retention,
                                 Later later) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  Duration delay = std::chrono::milliseconds(100);
  while (co_await WaitForNextAttempt(timer, &delay, 2, reservation.lease_expires_ms - 500, clock_)) {
    const Status stored = co_await CompleteOnce(reservation, response, retention);
    if (stored.ok()) {
      LogInfo("response stored on a later attempt",
              {{"key", reservation.key}, {"operation_id", reservation.operation_id}});
      if (later) later(LaterOutcome::kStored);
      co_return;
    }
    if (stored.code() == StatusCode::kFailedPrecondition) {
      // An attempt that failed (timed out) may have landed after all: the
      // record is then this reservation's completed one.
      const StatusOr<std::optional<Record>> now = co_await store_.Get(reservation.key, clock_.NowMillis());
      if (now.ok() && now->has_value() && (*now)->state == RecordState::kCompleted &&
          (*now)->owner == reservation.owner && (*now)->operation_id == reservation.operation_id) {
        LogInfo("response stored: an earlier attempt landed late",
                {{"key", reservation.key}, {"operation_id", reservation.operation_id}});
        if (later) later(LaterOutcome::kStored);
        co_return;
      }
      LogReservationGone(reservation);
      if (later) later(LaterOutcome::kLost);
      co_return;
    }
  }
  static LogLimiter limiter;
  LogError(limiter,
           "response not stored: the store kept failing through the lease; unless an attempt that timed out lands "
           "after all, the key is taken over and the request runs again once its lease ends",
           {{"key", reservation.key}, {"operation_id", reservation.operation_id}});
}

Task<Status> Engine::CompleteOnce(const Reservation& reservation, StoredResponse response, Duration retention) {
  const UnixMillis now = clock_.NowMillis();
  Record completed;
  completed.state = RecordState::kCompleted;
  completed.fingerprint = reservation.fingerprint;
  completed.owner = reservation.owner;
  completed.operation_id = reservation.operation_id;
  completed.created_ms = reservation.created_ms;
  completed.lease_expires_ms = 0;
  completed.expires_ms = retention.count() > 0 ? now + retention.count() : 0;
  completed.response = std::move(response);
  co_return co_await store_.Complete(reservation.key, reservation.owner, std::move(completed));
}

Task<Status> Engine::Complete(std::string key, std::string owner, StoredResponse response,
                              Duration retention) {
  StatusOr<std::optional<Record>> current = co_await store_.Get(key, clock_.NowMillis());
  if (!current.ok()) co_return current.status();
  const std::optional<Record>& held = *current;
  if (!held.has_value() || held->state != RecordState::kInFlight || held->owner != owner) {
    co_return FailedPreconditionError("engine: reservation not held by this owner");
  }
  Reservation reservation{std::move(key), std::move(owner), held->fingerprint,
                          held->operation_id, held->created_ms, held->lease_expires_ms};
  co_return co_await Complete(reservation, std::move(response), retention);
}

Task<Status> Engine::Release(std::string key, std::string owner) {
  co_return co_await store_.Release(std::move(key), std::move(owner));
}

Task<Status> Engine::Release(const Reservation& reservation) {
  co_return co_await store_.Release(reservation.key, reservation.owner);
}

Task<LookupResult> Engine::Lookup(std::string key, Duration wait) {
  const auto deadline = SteadyClock::now() + wait;
  // Once set, the watch was registered before the latest read.
  std::unique_ptr<Watch> watch;
  while (true) {
    const UnixMillis now = clock_.NowMillis();
    StatusOr<std::optional<Record>> found = co_await store_.Get(key, now);
    LookupResult r;
    if (!found.ok()) {
      r.status = found.status();
      co_return r;
    }
    if (!found->has_value()) {
      r.outcome = LookupOutcome::kNotFound;
      co_return r;
    }
    Record& record = **found;
    if (record.state == RecordState::kCompleted) {
      r.outcome = LookupOutcome::kCompleted;
      r.record = std::move(record);
      co_return r;
    }
    // An ended lease is not waited for: nobody is executing it.
    if (record.LeaseEndedAt(now) || wait.count() <= 0 ||
        (watch != nullptr && SteadyClock::now() >= deadline)) {
      r.outcome = LookupOutcome::kInFlight;
      r.retry_after = RetryAfter(record.lease_expires_ms, now);
      r.record = std::move(record);
      co_return r;
    }
    if (watch != nullptr && co_await watch->Changed(NextWake(deadline, record, now))) {
      watch.reset();
    }
    if (watch == nullptr) {
      StatusOr<std::unique_ptr<Watch>> made = co_await store_.WatchKey(key);
      if (!made.ok()) {
        r.status = made.status();
        co_return r;
      }
      watch = std::move(made).value();
    }
  }
}

}  // namespace idemgate::core

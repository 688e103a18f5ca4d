#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace idemgate {

// Wall-clock milliseconds since the Unix epoch. Leases and retention are wall
// clock because records outlive processes and are shared between gateways.
using UnixMillis = std::int64_t;

// Source of the current time. Production uses SystemClock; tests inject a
// FakeClock so that lease and retention expiry need no sleeps.
// Thread-safe: Now() may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual UnixMillis NowMillis() const = 0;
};

class SystemClock final : public Clock {
 public:
  UnixMillis NowMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // The process-wide instance.
  static const SystemClock& Instance() {
    static const SystemClock clock;
    return clock;
  }
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(UnixMillis start = 1'700'000'000'000) : now_(start) {}
  UnixMillis NowMillis() const override { return now_.load(std::memory_order_relaxed); }
  void Advance(std::chrono::milliseconds d) { now_.fetch_add(d.count(), std::memory_order_relaxed); }
  void Set(UnixMillis t) { now_.store(t, std::memory_order_relaxed); }

 private:
  std::atomic<UnixMillis> now_;
};

}  // namespace idemgate

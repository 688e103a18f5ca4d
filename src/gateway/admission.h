#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

// Per-route admission (SPEC §2 step 6): at most `max_in_flight` requests of
// a route are forwarded at once, counted across all worker threads; the
// rest get 429 too-many-requests with Retry-After.
namespace idemgate::gateway {

// Thread-safe, lock-free.
class alignas(64) AdmissionCounter {
 public:
  explicit AdmissionCounter(std::uint32_t limit) : limit_(limit) {}

  // Takes a slot; false when `limit` are taken (nothing is taken then).
  bool TryAcquire() {
    const std::uint32_t limit = limit_.load(std::memory_order_relaxed);
    std::uint32_t current = in_flight_.load(std::memory_order_relaxed);
    do {
      if (current >= limit) return false;
    } while (!in_flight_.compare_exchange_weak(current, current + 1, std::memory_order_acquire,
                                               std::memory_order_relaxed));
    return true;
  }
  void Release() { in_flight_.fetch_sub(1, std::memory_order_release); }

  std::uint32_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  std::uint32_t limit() const { return limit_.load(std::memory_order_relaxed); }
  // A reload may change the limit; requests in flight keep their slots.
  void set_limit(std::uint32_t limit) { limit_.store(limit, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> in_flight_{0};
  std::atomic<std::uint32_t> limit_;
};

// Holds a slot for its lifetime (RAII); empty when default-constructed.
class AdmissionSlot {
 public:
  AdmissionSlot() = default;
  explicit AdmissionSlot(AdmissionCounter* counter) : counter_(counter) {}
  ~AdmissionSlot() { Reset(); }
  AdmissionSlot(AdmissionSlot&& other) noexcept : counter_(other.counter_) { other.counter_ = nullptr; }
  AdmissionSlot& operator=(AdmissionSlot&& other) noexcept {
    if (this != &other) {
      Reset();
      counter_ = other.counter_;
      other.counter_ = nullptr;
    }
    return *this;
  }
  void Reset() {
    if (counter_ != nullptr) counter_->Release();
    counter_ = nullptr;
  }

 private:
  AdmissionCounter* counter_ = nullptr;
};

// The counters by route id, kept across config reloads so that requests in
// flight during a reload still count. Thread-safe (used at build time only).
class AdmissionRegistry {
 public:
  // The counter for `route_id` with `limit` (created, or re-limited).
  std::shared_ptr<AdmissionCounter> Get(const std::string& route_id, std::uint32_t limit) {
    std::lock_guard lock(mu_);
    auto& slot = counters_[route_id];
    if (!slot) {
      slot = std::make_shared<AdmissionCounter>(limit);
    } else {
      slot->set_limit(limit);
    }
    return slot;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<AdmissionCounter>> counters_;
};

// The Retry-After of a 429 from admission.
inline constexpr std::chrono::seconds kAdmissionRetryAfter{1};

}  // namespace idemgate::gateway

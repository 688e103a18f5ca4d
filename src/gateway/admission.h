#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

// Admission (SPEC §2 step 6): at most `max_in_flight` requests of a route,
// and at most `max_in_flight_per_tenant` of each tenant on it, are forwarded
// at once, counted across all worker threads; the rest get 429
// too-many-requests with Retry-After.
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

// Per-tenant admission on one route (`max_in_flight_per_tenant`): at most
// `limit` requests of each tenant at once, so one tenant cannot take a
// route's whole capacity. Thread-safe; a mutex around a small map whose
// entries live only while a tenant has requests in flight.
class TenantAdmission {
 public:
  explicit TenantAdmission(std::uint32_t limit) : limit_(limit) {}

  // Takes a slot for `tenant`; false when it has `limit` already.
  bool TryAcquire(const std::string& tenant) {
    std::lock_guard lock(mu_);
    std::uint32_t& n = in_flight_[tenant];
    if (n >= limit_) {
      if (n == 0) in_flight_.erase(tenant);
      return false;
    }
    ++n;
    return true;
  }
  void Release(const std::string& tenant) {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(tenant);
    if (it == in_flight_.end()) return;
    if (--it->second == 0) in_flight_.erase(it);
  }
  std::uint32_t in_flight(const std::string& tenant) const {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(tenant);
    return it == in_flight_.end() ? 0 : it->second;
  }
  // Tenants with requests in flight (the map's size).
  std::size_t tenants() const {
    std::lock_guard lock(mu_);
    return in_flight_.size();
  }
  std::uint32_t limit() const {
    std::lock_guard lock(mu_);
    return limit_;
  }
  // A reload may change the limit; requests in flight keep their slots.
  void set_limit(std::uint32_t limit) {
    std::lock_guard lock(mu_);
    limit_ = limit;
  }

 private:
  mutable std::mutex mu_;
  std::uint32_t limit_;
  std::map<std::string, std::uint32_t> in_flight_;
};

// Holds a tenant's slot for its lifetime (RAII); empty when default-constructed.
class TenantSlot {
 public:
  TenantSlot() = default;
  TenantSlot(TenantAdmission* admission, std::string tenant) : admission_(admission), tenant_(std::move(tenant)) {}
  ~TenantSlot() { Reset(); }
  TenantSlot(TenantSlot&& other) noexcept : admission_(other.admission_), tenant_(std::move(other.tenant_)) {
    other.admission_ = nullptr;
  }
  TenantSlot& operator=(TenantSlot&& other) noexcept {
    if (this != &other) {
      Reset();
      admission_ = other.admission_;
      tenant_ = std::move(other.tenant_);
      other.admission_ = nullptr;
    }
    return *this;
  }
  void Reset() {
    if (admission_ != nullptr) admission_->Release(tenant_);
    admission_ = nullptr;
  }

 private:
  TenantAdmission* admission_ = nullptr;
  std::string tenant_;
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
  // The per-tenant admission of `route_id` with `limit` (created, or re-limited).
  std::shared_ptr<TenantAdmission> GetPerTenant(const std::string& route_id, std::uint32_t limit) {
    std::lock_guard lock(mu_);
    auto& slot = per_tenant_[route_id];
    if (!slot) {
      slot = std::make_shared<TenantAdmission>(limit);
    } else {
      slot->set_limit(limit);
    }
    return slot;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<AdmissionCounter>> counters_;
  std::map<std::string, std::shared_ptr<TenantAdmission>> per_tenant_;
};

// The Retry-After of a 429 from admission.
inline constexpr std::chrono::seconds kAdmissionRetryAfter{1};

}  // namespace idemgate::gateway
